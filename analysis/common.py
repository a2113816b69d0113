"""Shared figure finishing: title, legend, grid, PNG file."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def finish(fig, ax, path: pathlib.Path, title: str, fontsize: int = 9) -> pathlib.Path:
    """Title, legend and grid on ``ax``; write ``fig`` to ``path`` (PNG, 120 dpi) and close it."""
    ax.set_title(title, fontsize=fontsize)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save(fig, path)


def save(fig, path: pathlib.Path) -> pathlib.Path:
    """Lay ``fig`` out, write it to ``path`` (PNG, 120 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
