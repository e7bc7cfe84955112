"""What a model_dir holds, without TensorFlow (the supervisor and `tpurun report` use it too).

* `names`: every name tpurun gives a file or directory in a model_dir, and the paths
  made of them: the one module that spells them;
* `time_account`: the time account a train's run record keeps: each field, its type
  and meaning, and the check a record passes before `tpurun report` counts it;
* `plain_files`: the reads and exclusive writes that need no TensorFlow (os, or gcsfs
  on gs://): the run records, the supervisor's record of a trainer that left none,
  the lease's object on gs://. Every other write goes through `tpurun.storage`.
"""
