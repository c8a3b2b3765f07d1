"""Open the heat example's output with xarray, without sluice, and plot the
middle slice of the last output step (a PNG, matplotlib).

    python examples/plot_heat.py /srv/root/run/heat out/heat.png
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import xarray as xr  # noqa: E402


def main(store: str, png: str) -> None:
    ds = xr.open_zarr(store, consolidated=False)
    temp = ds["temp"]
    last = temp.isel(time=-1)
    mid = last.isel(z=temp.sizes["z"] // 2)
    fig, ax = plt.subplots(figsize=(5, 4))
    mid.plot(ax=ax, cmap="inferno")
    ax.set_title(f"temp, time step {temp.sizes['time'] - 1}, z = {temp.sizes['z'] // 2}")
    fig.savefig(png, dpi=80)
    print(f"{png}: {dict(temp.sizes)}, total heat at the last step {float(last.sum()):.6f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
