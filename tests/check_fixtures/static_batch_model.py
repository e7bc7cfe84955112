"""Breaks `static-batch`: the training batches lack drop_remainder=True."""

from fixture_base import TinyModel

from tpurun.model import register


@register("check_static_batch")
class StaticBatch(TinyModel):
    def batch_train(self, dataset, params):
        return dataset.batch(params.batch_size)  # the last batch may be smaller
