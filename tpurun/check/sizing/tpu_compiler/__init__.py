"""The TPU's own compiler sizes each step of `tpurun check --target`, on a machine without a TPU.

libtpu (PyPI `libtpu`, with `jax`/`jaxlib`: the `tpu-compile` extra) has a
compile-only client that compiles for any TPU generation here, on the CPU.
`tpurun check --target=TYPE` hands it each step it sizes (the runners'
`replica_step`, as `tpurun.check.rules.step_builds.StepBuilder.step_call` builds it) and reads
what it made of it: the memory of one replica's step, its FLOPs and bytes
accessed. Without the extra, or when a compile fails, check falls back to its
XLA:CPU estimate (`tpurun.check.sizing.memory`) and says so in one line.

* `program`: TensorFlow's HLO of a step (tf2xla, from TensorSpecs), its
  parameters named, and the bytes of a parameter in the layout the TPU chose;
* `client`: this process's side of the compiler: one child process for every
  compile (`TpuCompiler`, `shared()`), time-limited, its answers cached;
* `server`: the child, which imports jax/libtpu and never TensorFlow (run as a
  script, not a module of this package);
* `sizing`: a compiled step as the memory table reads it (`CompiledStep`) and
  the per-generation compiler (`TpuSizer`).
"""
