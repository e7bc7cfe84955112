"""Shakespeare (byte LSTM) end to end through the CLI on a small generated text."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import assert_ok

# A text with an obvious pattern, so that a tiny LSTM learns it in 200 steps.
LINES = (
    "ROMEO: to be or not to be, that is the question.\n",
    "JULIET: wherefore art thou, Romeo?\n",
)
# One layer of 64 units: it learns this text better in 200 steps than two (held-out
# accuracy ~0.96 against ~0.68) in half the time; check traces the shipped two layers.
SMALL = (
    "--config.embedding_dim=16",
    "--config.lstm_units=(64,)",
    "--config.seq_len=40",
)


def test_bytes_round_trip_and_short_text_is_refused(tmp_path):
    from tpurun.models import shakespeare

    from tpurun.errors import RunError

    text = "Ünïcode ROMEO:\n"
    ids = shakespeare.encode(text)
    assert ids.dtype == np.int32 and ids.max() < 256
    assert shakespeare.decode(ids) == text
    (tmp_path / "short.txt").write_text("too short")
    from tpurun.configs import shakespeare as config_module

    config = config_module.get_config()
    config.data.path = str(tmp_path / "short.txt")
    model = shakespeare.Shakespeare(config)
    with pytest.raises(RunError, match="a window needs config.seq_len"):
        model.train_arrays()


@pytest.mark.slow
def test_loss_falls_eval_generate_and_export(tpurun_cli, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(LINES[i % 2] for i in range(200)))  # 8.4 KB
    model_dir = tmp_path / "model"
    common = ("--config=shakespeare", f"--model_dir={model_dir}", *SMALL)
    data = f"--config.data.path={text}"

    result = assert_ok(
        tpurun_cli(
            "train",
            *common,
            data,
            "--use_tpu=false",
            "--batch_size=16",
            "--train_steps=200",
            "--iterations=50",
            # The plain host loop: "auto" would compile XLA's and the plain one to time
            # them (the choice: test_host_loops.py's), more than the 200 steps cost.
            "--config.train.xla=false",
        )
    )
    losses = [float(x) for x in re.findall(r"step \d+/200  loss ([\d.]+)", result.stderr)]
    assert len(losses) == 4, result.stderr
    assert losses[-1] < 0.6 * losses[0], losses

    # The held-out last 10% of the text, in windows of 40 bytes: >= 0.6 of the
    # next bytes right (this one reaches ~0.96 in 200 steps).
    assert_ok(tpurun_cli("eval", *common, data))
    [results] = (model_dir / "eval" / "val").glob("results-*.json")
    accuracy = json.loads(results.read_text())["accuracy"]
    print(f"shakespeare: losses {losses}, held-out next-byte accuracy {accuracy:.4f}")
    assert accuracy >= 0.6

    # Generation needs no data: the prompt, continued by config.predict.length bytes.
    result = assert_ok(
        tpurun_cli("predict", *common, "--prompt=ROMEO:", "--config.predict.length=80")
    )
    assert result.stdout.startswith("ROMEO:"), result.stdout
    assert len(result.stdout.rstrip("\n")) > len("ROMEO:") + 40
    output = tmp_path / "generated.jsonl"
    assert_ok(
        tpurun_cli(
            "predict",
            *common,
            "--prompt=JULIET:",
            "--config.predict.temperature=0",
            "--config.predict.num_samples=2",
            f"--output={output}",
        )
    )
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 2 and rows[0] == rows[1]  # greedy: both samples agree
    assert rows[0]["text"].startswith("JULIET:") and len(rows[0]["text"]) > len("JULIET:") + 100

    # Export: byte ids of any length -> the next byte.
    import tensorflow as tf
    from tpurun.models.shakespeare import encode

    export_dir = tmp_path / "export"
    assert_ok(tpurun_cli("export", *common, f"--export_dir={export_dir}"))
    assert (export_dir / "saved_model.pb").is_file()
    serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    for prefix in ("ROMEO: to be or not to b", "JULIET: wherefore art thou, Rom"):
        out = serving(ids=tf.constant([encode(prefix)]))
        assert out["probabilities"].shape == (1, 256)
        np.testing.assert_allclose(out["probabilities"].numpy().sum(), 1, rtol=1e-5)
        assert int(out["next_char_ids"][0]) == int(np.argmax(out["probabilities"][0]))
