"""EFPSN: private and accurate decentralized optimization. `efpsn.train(data_dir, **flags)` runs
a local network from Python (efpsn/notebook.py); the command line is `efpsn`."""

from __future__ import annotations

from typing import Any

__all__ = ["train"]


def __getattr__(name: str) -> Any:
    if name == "train":  # imported on first use: `import efpsn` stays light
        from efpsn.notebook import train

        return train
    raise AttributeError(f"module 'efpsn' has no attribute {name!r}")
