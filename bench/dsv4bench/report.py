"""Output: CSV files, a printed table, PNG plots (matplotlib, Agg backend)."""
import csv
import json
import os


def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        return f"{v:.{nd}f}"
    return str(v)


def write_csv(path, rows, columns):
    """Write rows (dicts) with the given column order; missing values are empty."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            out = []
            for c in columns:
                v = r.get(c)
                if v is None:
                    out.append("")
                elif isinstance(v, float):
                    out.append(f"{v:.6g}")
                else:
                    out.append(v)
            w.writerow(out)
    return path


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=str)
    return path


def print_table(title, rows, columns, headers=None, nd=None):
    """Print rows as an aligned text table. nd: {column: decimals}."""
    nd = nd or {}
    headers = headers or columns
    cells = [[fmt(r.get(c), nd.get(c, 2)) for c in columns] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def ensure_dir(path):
    os.makedirs(path, exist_ok=True)
    return path
