"""Write bottleneck spectra of several models as one CSV and one PNG plot."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from .runs import BottleneckSpectra

CSV_NAME = "bottleneck_spectra.csv"
PLOT_NAME = "bottleneck_spectra.png"


def write_report(spectra: Sequence[BottleneckSpectra], out_dir: str | Path) -> dict[str, Path]:
    """Write ``bottleneck_spectra.csv`` and ``bottleneck_spectra.png`` into ``out_dir``.

    The CSV has one row per singular value: ``label, head, dim, spectrum`` (``log_prob`` or
    ``jacobian``), ``index`` (0-based, descending order), ``value`` and ``relative`` (value over
    the largest of its spectrum), plus ``log_prob_rank``. The plot has two panels, the relative
    log-probability spectrum and the relative Jacobian spectrum on a log scale, one line per
    model, with a marker at ``D`` on the first (the bound of a dot-product softmax once centred).

    Args:
        spectra: one entry per model, from :func:`~recsys_midx.analysis.bottleneck_spectra`.
        out_dir: created if missing.

    Returns:
        ``{"csv": PATH, "plot": PATH}``.

    Raises:
        ValueError: if ``spectra`` is empty.

    Example:
        ```python
        write_report([bottleneck_spectra(load_run(path)) for path in run_dirs], "reports")
        ```
    """
    if not spectra:
        raise ValueError("spectra is empty: nothing to report")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / CSV_NAME, "plot": out_dir / PLOT_NAME}
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["label", "head", "dim", "log_prob_rank", "spectrum", "index", "value", "relative"]
        )
        for entry in spectra:
            for name, values in (("log_prob", entry.log_prob), ("jacobian", entry.jacobian)):
                top = float(values.max()) if values.numel() else 0.0
                for index, value in enumerate(values.tolist()):
                    writer.writerow(
                        [
                            entry.label,
                            entry.head,
                            entry.dim,
                            entry.log_prob_rank,
                            name,
                            index,
                            value,
                            value / top if top > 0 else 0.0,
                        ]
                    )
    _plot(spectra, paths["plot"])
    return paths


def _plot(spectra: Sequence[BottleneckSpectra], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    floor = 1e-16  # float64 round-off: exact zeros would vanish from a log scale
    for entry in spectra:
        for axis, values in ((left, entry.log_prob), (right, entry.jacobian)):
            relative = (values / values.max()).clamp_min(floor).numpy()
            axis.plot(range(1, len(relative) + 1), relative, label=entry.label)
    # Centring leaves a dot-product softmax at most D non-zero singular values.
    for dim in sorted({entry.dim for entry in spectra}):
        left.axvline(dim, color="grey", linestyle=":", linewidth=1)
        left.text(dim, 1.0, f" D={dim}", color="grey", va="top", fontsize=8)
    left.set_title("Centred log-probability matrix")
    right.set_title("Jacobian d log p / d h (mean over contexts)")
    for axis in (left, right):
        axis.set_yscale("log")
        axis.set_xlabel("singular value index")
        axis.set_ylabel("singular value / largest")
        axis.grid(True, which="major", alpha=0.3)
    left.set_xscale("log")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
