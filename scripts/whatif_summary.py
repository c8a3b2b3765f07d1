"""The summary `scripts/whatif-bench.sh` and `scripts/whatif-fio.sh` print:
the real runs of each policy (and each one against the median of the
others, the floor under any prediction, as `sluice sim --validate` prints
it), then every trace's prediction of every policy against the median of
that policy's real runs."""

import statistics


def report(device, policies, real, pred, what=''):
    """`real`: policy -> real times (s); `pred`: (trace's policy, predicted
    policy) -> predicted times (s); `what` names the figure ('readers ')."""
    print('device:', device)
    med = {p: statistics.median(v) for p, v in real.items()}
    for p in policies:
        print(f'real {p}: {what}{", ".join(f"{x:.3f}" for x in real[p])} s (median {med[p]:.3f})')
        if len(real[p]) > 1:
            others = [statistics.median(real[p][:i] + real[p][i + 1:]) for i in range(len(real[p]))]
            floor = [(x - m) / m * 100 for x, m in zip(real[p], others)]
            print(f'  each against the median of the others: {", ".join(f"{e:+.1f}%" for e in floor)}')
    for (src, q), v in sorted(pred.items()):
        errs = ', '.join(f'{(x - med[q]) / med[q] * 100:+.1f}%' for x in v)
        print(f'{src} trace -> {q}: {", ".join(f"{x:.3f}" for x in v)} s; against real {q} {med[q]:.3f} s: {errs}')
