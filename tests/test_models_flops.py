"""FLOPS: trains a matmul chain, then `tpurun predict` prints TFLOP/s for float32 and bfloat16."""

from __future__ import annotations

import re

import pytest
from conftest import assert_ok

NUMBER = r"[\d.]+(?:e[-+]\d+)?"  # as printed with :.4g


@pytest.mark.parametrize(
    "setting, dtypes", [("both", ("float32", "bfloat16")), ("bfloat16", ("bfloat16",))]
)
def test_dtype_setting(setting, dtypes):
    from tpurun.models import flops

    assert flops.dtypes_of(setting) == dtypes


def test_unknown_dtype_is_a_usage_error():
    from tpurun.models import flops

    from tpurun.errors import UsageError

    with pytest.raises(UsageError, match="float32, bfloat16 or both"):
        flops.dtypes_of("float16")


@pytest.mark.slow
def test_train_then_predict_prints_tflops_per_replica_and_total(tpurun_cli, tmp_path):
    common = (
        "--config=flops",
        f"--model_dir={tmp_path}",
        "--use_tpu=false",
        "--num_shards=2",
        "--config.flops.n=256",
        "--config.flops.matmuls=4",
        "--config.flops.loops=10",
        "--batch_size=512",
        "--eval_batch_size=512",
        "--predict_batch_size=512",
    )
    result = assert_ok(tpurun_cli("train", *common, "--train_steps=2", "--iterations=2"))
    # (6 x 4 - 2) x 256 x 256^2 per replica and step (4 matmuls forward, 7 backward): 0.37.
    assert "a training step is 0.4 GFLOP per replica" in result.stderr
    assert re.search(r"step 2/2  loss [\d.]+", result.stderr)

    result = assert_ok(tpurun_cli("predict", *common))
    lines = result.stdout.strip().splitlines()
    print("\n".join(lines))
    assert len(lines) == 2
    for line, dtype in zip(lines, ("float32", "bfloat16"), strict=True):
        match = re.fullmatch(
            rf"{dtype}: ({NUMBER}) TFLOP/s per replica, ({NUMBER}) TFLOP/s total "
            rf"\(2 replica\(s\), 40 matmuls of 256x256 each in ({NUMBER}) s\)",
            line,
        )
        assert match, line
        per_replica, total, seconds = map(float, match.groups())
        assert per_replica > 0 and seconds > 0
        # Honest arithmetic: 2 replicas x 40 products x 2 N^3 over the measured time
        # (to the 4 digits printed).
        assert total == pytest.approx(2 * per_replica, rel=2e-3)
        assert total == pytest.approx(2 * 40 * 2 * 256**3 / seconds / 1e12, rel=2e-3)
