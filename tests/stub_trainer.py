"""A trainer for the supervisor's tests: does what its plan says, in milliseconds, no TensorFlow.

    python tests/stub_trainer.py PLAN.json MODEL_DIR

PLAN is a list, one entry per attempt (the supervisor's TPURUN_SUPERVISED says which):
{"record": bool, "checkpoints": [steps], "end": "kill" | "finish" | "exit:N"}.
With "record", it writes its run record as a trainer first writes it
(`tpurun.actions.goodput.initial_account`: its start, its supervisor, its restart
number, the death it was told of), and with "finish" its end; it makes the
checkpoints' files (`ckpt-<step>.index` and `.data-00000-of-00001`, named as
TensorFlow names them: the supervisor reads only the names), tells its supervisor
its last step through the progress pipe, then ends as planned ("kill": SIGKILL
itself, as the OOM killer would).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

plan_path, model_dir = sys.argv[1], sys.argv[2]
restart = int(os.environ["TPURUN_SUPERVISED"].split("/")[0])
attempt = json.loads(open(plan_path).read())[restart]

steps = attempt.get("checkpoints", [])
if attempt.get("record") or steps:
    os.makedirs(os.path.join(model_dir, "runs"), exist_ok=True)
for step in steps:
    for suffix in (".data-00000-of-00001", ".index"):
        with open(os.path.join(model_dir, f"ckpt-{step}{suffix}"), "w") as f:
            f.write("stub")
if steps and os.environ.get("TPURUN_PROGRESS_FD"):
    os.write(int(os.environ["TPURUN_PROGRESS_FD"]), f"{max(steps)} {time.time():.6f}\n".encode())

if attempt.get("record"):
    start = float(os.environ["TPURUN_SPAWNED_AT"])
    goodput = {
        "process_start": start,
        "spawned_at": start,
        "supervisor_start": float(os.environ["TPURUN_SUPERVISOR_START"]),
        "restart": restart,
        "updated": time.time(),
    }
    if os.environ.get("TPURUN_PREVIOUS_DEATH"):
        goodput["previous_death"] = json.loads(os.environ["TPURUN_PREVIOUS_DEATH"])
    if attempt["end"] == "finish":
        goodput["end"] = {"t": time.time(), "reason": "finished", "step": None}
        goodput["updated"] = time.time()
    moment = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    with open(os.path.join(model_dir, "runs", f"{moment}-train.json"), "w") as f:
        json.dump({"run_config": {}, "goodput": goodput}, f)

end = attempt["end"]
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0 if end == "finish" else int(end.split(":")[1]))
