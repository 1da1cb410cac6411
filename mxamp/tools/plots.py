"""The reports' charts, drawn offline with matplotlib (Agg) as SVG text to
put inline in a page: errors across a batch, per-layer errors, the share
of operators and FLOPs in each precision, and INT8 calibration ranges."""
import io

# One colour per precision, in every chart and in the graph picture.
PRECISION_COLOURS = {"float16": "#6baed6", "bfloat16": "#9ecae1", "int8": "#74c476",
                     "uint8": "#a1d99b", "float32": "#fdae6b"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display: reports are written anywhere
    import matplotlib.pyplot as plt
    return plt


def _svg(fig):
    """The figure as SVG text without the XML prologue (it goes inside HTML)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _figure(n_items, per_item=0.28, height=3.2, min_width=6.0):
    plt = _pyplot()
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, smaller
    return plt.subplots(figsize=(max(min_width, n_items * per_item + 1.5), height))


def error_chart(rows):
    """Relative error (log scale) per model, a marker per dtype; `rows` is
    [(model label, dtype, error or None)] (None: failed, not drawn)."""
    models = list(dict.fromkeys(m for m, _, _ in rows))
    dtypes = list(dict.fromkeys(d for _, d, _ in rows))
    fig, ax = _figure(len(models), per_item=0.35)
    for dtype, marker in zip(dtypes, "os^vD"):
        found = {m: e for m, d, e in rows if d == dtype and e is not None}
        ax.scatter([i for i, m in enumerate(models) if m in found],
                   [max(found[m], 1e-12) for m in models if m in found], marker=marker, s=36,
                   label=dtype, color=PRECISION_COLOURS.get(dtype, "#888888"),
                   edgecolors="#333333", linewidths=0.5, zorder=2)
    ax.set_yscale("log")
    ax.set_xlim(-0.7, len(models) - 0.3)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("relative L2 error vs float32")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _svg(fig)


def layer_error_chart(indices, errors, kinds, title):
    """Relative error of each layer's output (log scale) against its index
    in graph order, the points coloured by the precision the layer runs in
    (`kinds`). Errors below 1e-6 (float32 layers that compute exactly what
    float32 does, such as anchors) sit on the chart's floor."""
    fig, ax = _figure(0, height=3.0, min_width=9.0)
    floor = 1e-6
    shown = [max(e, floor) for e in errors]
    ax.plot(indices, shown, color="#bbbbbb", linewidth=0.8, zorder=1)
    for kind in dict.fromkeys(kinds):
        picked = [k for k, found in enumerate(kinds) if found == kind]
        ax.scatter([indices[k] for k in picked], [shown[k] for k in picked], s=9,
                   zorder=2, label=kind, color=PRECISION_COLOURS.get(kind, "#888888"))
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 2)
    ax.set_xlabel("layer (the # column of the table below)")
    ax.set_ylabel("relative L2 error vs float32")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _svg(fig)


def share_chart(rows):
    """Two panels of stacked horizontal bars, one bar per (model, dtype):
    the share of operators and of FLOPs in each precision. `rows` is
    [(label, {precision: operators}, {precision: FLOPs})]."""
    plt = _pyplot()
    precisions = sorted({p for _, ops, flops in rows for p in (*ops, *flops)},
                        key=lambda p: (p == "float32", p))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(rows) + 1.4), sharey=True)
    for ax, index, what in ((axes[0], 1, "operators"), (axes[1], 2, "FLOPs")):
        left = [0.0] * len(rows)
        for p in precisions:
            shares = [100 * row[index].get(p, 0) / max(sum(row[index].values()), 1)
                      for row in rows]
            ax.barh(range(len(rows)), shares, left=left, label=p,
                    color=PRECISION_COLOURS.get(p, "#888888"))
            left = [a + b for a, b in zip(left, shares)]
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"% of {what}")
        ax.invert_yaxis()
    axes[0].set_yticks(range(len(rows)))
    axes[0].set_yticklabels([label for label, _, _ in rows], fontsize=8)
    axes[1].legend(fontsize=8, loc="lower right")
    return _svg(fig)


def range_chart(indices, lows, highs):
    """INT8 calibration: each calibrated tensor's range [min, threshold]
    as a vertical bar at its layer's index in graph order."""
    fig, ax = _figure(0, height=3.0, min_width=9.0)
    ax.bar(indices, [h - lo for lo, h in zip(lows, highs)], bottom=lows, width=0.8,
           color=PRECISION_COLOURS["int8"])
    ax.axhline(0, color="#555555", linewidth=0.6)
    ax.set_xlabel("layer (the # column of the table below)")
    ax.set_ylabel("calibrated range\n(min .. threshold)")
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig)
