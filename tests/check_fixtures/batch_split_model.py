"""The clean fixture model; its config (batch_split.py) breaks `batch-split`."""

from fixture_base import TinyModel

from tpurun.model import register


@register("check_batch_split")
class BatchSplit(TinyModel):
    pass
