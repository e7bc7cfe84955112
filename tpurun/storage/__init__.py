"""The one place that writes, renames and deletes files in a model_dir through TensorFlow.

A model_dir is the user's: tpurun may find links, look-alike names and damaged
files there, left by people, crashes and full disks. The rules, on a local disk,
gs:// and ram:// alike:

* Deletes only what it made, by exact name (the names are `tpurun.layout.names`'s),
  and never outside the model_dir it was given: `removals`.
* Never through a symbolic link (local disks; gs:// and ram:// have none): a link
  in tpurun's way is removed as a link, its target untouched; a directory tree is
  walked without following links; a directory tpurun writes into that is a link
  to elsewhere is refused (`paths.make_dir`).
* Temporary names are unique per process and created exclusively; a record is
  replaced atomically: `writes`. A temporary left by a process that died is
  removed by the next run (`removals.remove_leftovers`).
* Records are read through `records`: as written, or `DamagedRecord` naming the
  file and what is wrong; each caller recovers or fails with one line.
* A failed storage request is never taken for an answer (`paths.isdir`,
  `paths.listdir`), and a gs:// bucket is checked once before a directory is made
  in it (`paths.require_bucket`).

What must work without TensorFlow (the supervisor, `tpurun report`, the lease's
object on gs://) reads and writes through `tpurun.layout.plain_files`, by the same
rules. The modules of this package:

* `paths`: inside the model_dir or not, made, listed strictly (joined by `layout.names`);
* `writes`: exclusive creation, atomic replacement, renames;
* `removals`: removal by exact name, the leftovers of dead processes;
* `records`: records read back, or DamagedRecord;
* `checkpoints`: ckpt-<step>, the state file, a verified restore with fallback;
* `train_config`: the config a model_dir was trained with;
* `eval_results`, `best`: evaluations' results, the best checkpoint;
* `lease`: one trainer per model_dir;
* `background/`: the run's writer thread, staged TensorBoard events, a save's upload.
"""

from __future__ import annotations

from tpurun.layout.names import basename, join
from tpurun.layout.plain_files import is_local, process_alive
from tpurun.storage.paths import (
    failure,
    inside,
    is_link,
    isdir,
    listdir,
    make_dir,
    require_bucket,
    require_inside,
)
from tpurun.storage.removals import (
    remove,
    remove_file,
    remove_file_quietly,
    remove_leftovers,
    remove_tree,
)
from tpurun.storage.writes import move_into, probe_writable, rename_dir, write_atomically

__all__ = [
    "basename",
    "failure",
    "inside",
    "is_link",
    "is_local",
    "isdir",
    "join",
    "listdir",
    "make_dir",
    "move_into",
    "probe_writable",
    "process_alive",
    "remove",
    "remove_file",
    "remove_file_quietly",
    "remove_leftovers",
    "remove_tree",
    "rename_dir",
    "require_bucket",
    "require_inside",
    "write_atomically",
]
