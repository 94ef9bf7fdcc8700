"""The training loader: order functions, cache, streaming, prefetch and framework outputs.

Examples
--------
>>> import feedline as fl
>>> from feedline.loader.loader import Loader
>>> [b["id"].tolist() for b in Loader(fl.range(4), batch_size=2, shuffle=False, format="numpy")]
[[0, 1], [2, 3]]
"""

from feedline.loader import nodes
from feedline.loader.data.windows import Windows
from feedline.loader.loader import Loader
from feedline.loader.options import LoaderOptions
from feedline.loader.transforms import ImageTransform

__all__ = ["ImageTransform", "Loader", "LoaderOptions", "Windows", "nodes"]
