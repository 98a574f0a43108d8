"""The suite's PNG: ingest and receive rates as grouped bars, one group per workload."""

from pathlib import Path

from bench.report import Figure

SECTIONS = ("ingest", "receive")


def plot_rates(figures: list[Figure], path: Path, title: str) -> bool:
    """Bars of samples/s (lines/s) per path and workload, one panel per section; False if there is
    nothing to plot. A panel whose values span more than 20x gets a log scale (and says so): the
    references receive tens of times faster than tsgate stores."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a build box
    from matplotlib import pyplot

    panels = {}
    for figure in figures:
        if figure.section in SECTIONS and figure.unit in ("samples/s", "lines/s") and " vs " not in figure.name:
            who, _, workload = figure.name.partition(", ")
            panels.setdefault(figure.section, {}).setdefault(workload, {})[who] = figure.value
    if not panels:
        return False
    # One colour per path across both panels, so tsgate's bars look alike in each.
    everyone = dict.fromkeys(who for groups in panels.values() for group in groups.values() for who in group)
    colors = dict(zip(everyone, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = pyplot.subplots(1, len(panels), figsize=(7 * len(panels), 5.5), squeeze=False)
    for axis, (section, groups) in zip(axes[0], panels.items()):
        paths = list(dict.fromkeys(who for group in groups.values() for who in group))
        width = 0.8 / max(len(group) for group in groups.values())
        for g, group in enumerate(groups.values()):
            present = [who for who in paths if who in group]
            for k, who in enumerate(present):
                x = g + (k - (len(present) - 1) / 2) * width
                bars = axis.bar([x], [group[who]], width, color=colors[who], label=who)
                axis.bar_label(bars, [f"{group[who] / 1000:.1f}k"], fontsize=7, padding=2)
        handles = {label: handle for handle, label in zip(*axis.get_legend_handles_labels())}
        axis.legend(handles.values(), handles.keys(), fontsize=8)
        axis.set_xticks(range(len(groups)), list(groups), fontsize=8)
        values = [value for group in groups.values() for value in group.values()]
        if max(values) > 20 * min(values):
            axis.set_yscale("log")
        scale = ", log scale" if axis.get_yscale() == "log" else ""
        axis.set_ylabel(f"samples per second (plaintext: lines){scale}")
        axis.set_title(
            "ingest: first byte until all stored in Cassandra"
            if section == "ingest"
            else "receive: first byte until all consumed",
            fontsize=10,
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)
    return True
