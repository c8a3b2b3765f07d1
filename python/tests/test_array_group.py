"""The Panda API in Python: ``sluice.array.Array`` and
``ArrayGroup`` write timesteps that xarray opens as a Dataset with a time
dimension, read steps back into the ranks' blocks, and checkpoint and
restart; the heat example, killed mid-run by ``os._exit`` and restarted
from its checkpoint under a real ``mpirun``, gives arrays identical to a
run that never stopped, and its plot script draws the output."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
sa = pytest.importorskip("sluice.array")

import sluice  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(server, comm):
    return sluice.Client(server[0], app="group-test", client_id=comm.Get_rank())


def field(shape, step, rank_rows):
    """A deterministic value per element and step (rows of dimension 0)."""
    z = np.arange(rank_rows.start, rank_rows.stop).reshape(-1, *([1] * (len(shape) - 1)))
    rest = np.arange(int(np.prod(shape[1:]))).reshape(shape[1:])
    return (z * 1000 + rest + step * 0.5).astype(np.float64)


@pytest.mark.parametrize("strategy", ["server-directed", "two-phase"])
def test_timesteps_open_in_xarray_with_a_time_dimension_and_read_back(server, comm, client, strategy, on_rank0):
    addr, root = server
    rank, n = comm.Get_rank(), comm.Get_size()
    temp = sa.Array("temp", (8 * n, 6, 5), "float64", memory=["block", "*", "*"], disk=(4, 6, 5), shards=(8, 6, 5), dims=["z", "y", "x"])
    dens = sa.Array("dens", (4 * n, 3), "float32", memory=["block", "*"], disk=(2, 3), dims=["zc", "yc"])
    g = sa.ArrayGroup(f"sim/g1-{strategy}", [temp, dens], comm, client, strategy=strategy)
    rows = {"temp": range(rank * 8, rank * 8 + 8), "dens": range(rank * 4, rank * 4 + 4)}
    for step in range(3):
        g.timestep(step, {"temp": field(temp.shape, step, rows["temp"]), "dens": field(dens.shape, step, rows["dens"]).astype(np.float32)})
    # Every rank reads its blocks of a step back.
    back = g.read(1)
    np.testing.assert_array_equal(back["temp"], field(temp.shape, 1, rows["temp"]))
    np.testing.assert_array_equal(back["dens"], field(dens.shape, 1, rows["dens"]).astype(np.float32))
    comm.Barrier()

    def opened():
        ds = xr.open_zarr(f"{root}/sim/g1-{strategy}", consolidated=False)
        assert ds["temp"].dims == ("time", "z", "y", "x") and ds["temp"].shape == (3, 8 * n, 6, 5)
        assert ds["dens"].dims == ("time", "zc", "yc") and ds["dens"].dtype == np.float32
        for step in range(3):
            np.testing.assert_array_equal(ds["temp"].isel(time=step).values, field(temp.shape, step, range(8 * n)))

    on_rank0(opened)
    # A step written out of order grows the time axis; the gap reads as 0.
    g.timestep(5, {"temp": field(temp.shape, 5, rows["temp"]), "dens": field(dens.shape, 5, rows["dens"]).astype(np.float32)})
    assert float(np.abs(g.read(4, ["temp"])["temp"]).sum()) == 0.0
    np.testing.assert_array_equal(g.read(5, ["temp"])["temp"], field(temp.shape, 5, rows["temp"]))
    with pytest.raises(IndexError):
        g.read(6)
    with pytest.raises(ValueError):
        g.timestep(6, {"temp": field(temp.shape, 6, rows["temp"])})


@pytest.mark.parametrize("strategy", ["server-directed", "two-phase"])
def test_checkpoint_and_restart_in_process(server, comm, client, strategy):
    rank, n = comm.Get_rank(), comm.Get_size()
    a = sa.Array("u", (4 * n, 4), "float64", memory=["block", "*"], disk=(4, 4))
    g = sa.ArrayGroup(f"sim/g2-{strategy}", [a], comm, client, strategy=strategy)
    with pytest.raises(FileNotFoundError):
        g.restart()
    rows = range(rank * 4, rank * 4 + 4)
    g.checkpoint(10, {"u": field(a.shape, 10, rows)})
    g.checkpoint(20, {"u": field(a.shape, 20, rows)})
    # A new group object (a new job) finds the latest.
    step, blocks = sa.ArrayGroup(f"sim/g2-{strategy}", [a], comm, client, strategy=strategy).restart()
    assert step == 20
    np.testing.assert_array_equal(blocks["u"], field(a.shape, 20, rows))


def test_the_heat_example_killed_and_restarted_matches_a_run_that_never_stopped(server, comm, on_rank0):
    addr, root = server

    def run():
        # A job of its own under mpirun, started from rank 0 of this one:
        # the launcher's variables of this job are left out.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_"))}
        py = sys.executable

        def heat(*args):
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", py, str(REPO / "examples" / "heat.py"),
                   "--server", addr, "--n", "16", "--steps", "30", "--output-every", "5", "--checkpoint-every", "10", *args]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

        whole = heat("--out", "heat/whole")
        assert whole.returncode == 0, whole.stderr[-2000:]
        killed = heat("--out", "heat/crash", "--kill-at", "17")
        assert killed.returncode != 0, "os._exit(9) ends the job"
        again = heat("--out", "heat/crash", "--restart")
        assert again.returncode == 0 and "restarted from the checkpoint of step 10" in again.stdout, again.stdout + again.stderr[-2000:]
        # The conserved total heat is printed the same by both.
        assert whole.stdout.strip().splitlines()[-1] == again.stdout.strip().splitlines()[-1]
        a = xr.open_zarr(f"{root}/heat/whole", consolidated=False)["temp"].values
        b = xr.open_zarr(f"{root}/heat/crash", consolidated=False)["temp"].values
        assert a.shape == (7, 16, 16, 16)
        np.testing.assert_array_equal(a, b)
        png = Path(root) / "heat.png"
        plot = subprocess.run([py, str(REPO / "examples" / "plot_heat.py"), f"{root}/heat/crash", str(png)], capture_output=True, text=True, timeout=120)
        assert plot.returncode == 0, plot.stderr[-2000:]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000

    on_rank0(run)


def test_a_migrated_group_reads_its_steps_and_a_rank_local_mistake_fails_every_rank(server, comm, client, on_rank0):
    addr, root = server
    rank, n = comm.Get_rank(), comm.Get_size()
    a = sa.Array("v", (2 * n, 3), "float64", memory=["block", "*"], disk=(2, 3))
    g = sa.ArrayGroup("sim/g3", [a], comm, client)
    rows = range(rank * 2, rank * 2 + 2)
    for step in range(2):
        g.timestep(step, {"v": field(a.shape, step, rows)})
    comm.Barrier()

    def migrate():
        r = subprocess.run([os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice")), "array", "migrate", ":sim/g3", "--to", ":tape/g3"],
                           env={**os.environ, "SLUICE_SERVER": addr}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    on_rank0(migrate)
    np.testing.assert_array_equal(g.read(1)["v"], field(a.shape, 1, rows))
    # Only rank 0 passes a block of the wrong shape: every rank raises,
    # none waits for the others forever.
    bad = field(a.shape, 2, rows)[:1] if rank == 0 else field(a.shape, 2, rows)
    with pytest.raises(ValueError):
        sa.ArrayGroup("sim/g4", [a], comm, client).timestep(0, {"v": bad})
