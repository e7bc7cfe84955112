"""What a --warm_start_from or --checkpoint=PATH path is, told apart by itself.

    a checkpoint prefix        model.ckpt-N, bert_model.ckpt, ckpt-N: its .index names it
    a model_dir                its `checkpoint` state file names the newest (TPUEstimator's,
                               tpurun's); without one, the newest `<name>-<step>.index`
    a SavedModel directory     saved_model.pb beside variables/: its variables/variables

Then the checkpoint itself says its kind: one written by tf.train.Checkpoint (tpurun,
any TF2 program, a TF2 SavedModel's variables) carries its object graph
(`_CHECKPOINTABLE_OBJECT_GRAPH`) and is read through the model's structure; one
without it was written by a name-based tf.compat.v1.train.Saver (a TPUEstimator run,
a TF1 Estimator export) and is read through config.name_map. Local or gs://: one
listing of the path, then the .index (TensorFlow's CheckpointReader); no tensor is
read here but the global step, and nothing is ever written.
"""

from __future__ import annotations

import dataclasses
import enum
import re

import tensorflow as tf
from google.protobuf import message as protobuf_message
from google.protobuf import text_format

from tpurun import storage, tf_internals
from tpurun.errors import RunError, TpurunError, Unavailable, UsageError, storage_errors
from tpurun.errors.tf_errors import one_line
from tpurun.layout import names

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
# An object-based checkpoint's key of a variable's value: `<object path>/` + this.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
GLOBAL_STEP = "global_step"
STATE_FILE = names.STATE_FILE  # a TPUEstimator model_dir names its newest as tpurun's does
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVED_MODEL_VARIABLES = "variables/variables"
_STEP = re.compile(r".*-(\d+)")
# What reading a damaged .index raises (an OpError "not an sstable", DataLoss, ...);
# a failed storage request is told apart by storage_errors (tpurun.commands.run).
_DAMAGE = (tf.errors.DataLossError, tf.errors.OutOfRangeError, ValueError, IndexError)


class Kind(enum.Enum):
    NAMES = "name-based (TF1)"
    OBJECTS = "object-based (TF2)"


@dataclasses.dataclass(frozen=True)
class SourceVariable:
    """A variable of the source: `name` as tf.train.list_variables prints it (for an
    object-based checkpoint, its object path: `model/layer_with_weights-0/kernel`), `key`
    the tensor's key in the checkpoint."""

    name: str
    key: str
    shape: tuple[int, ...]
    dtype: tf.DType
    saved_as: str = ""  # object-based: the name its writer gave it (a Keras variable's path)


@dataclasses.dataclass(frozen=True)
class Source:
    """A checkpoint tpurun did not necessarily write, opened (its .index read) but not loaded."""

    given: str  # the path as the user gave it
    flag: str  # where it was given (--warm_start_from, --checkpoint), for the errors
    prefix: str  # the checkpoint read: <prefix>.index and its .data files
    kind: Kind
    origin: str  # how `prefix` was found from `given`, for the report ("": it is `given`)
    directory: str  # where it lives: nothing is written there
    saved_model: bool  # a SavedModel's variables (`directory` is the SavedModel)
    variables: dict[str, SourceVariable]  # by name, in the checkpoint's (sorted) order
    reader: tf.train.CheckpointReader = dataclasses.field(repr=False, compare=False)
    graph: tf_internals.ObjectGraph | None = dataclasses.field(repr=False, compare=False)

    @property
    def described(self) -> str:
        """`/m/model.ckpt-100 (a name-based (TF1) checkpoint: the newest of /m, as its checkpoint
        file says)`."""
        origin = f": {self.origin}" if self.origin else ""
        article = "an" if self.kind is Kind.OBJECTS else "a"
        return f"{self.prefix} ({article} {self.kind.value} checkpoint{origin})"

    def step_variable(self) -> SourceVariable | None:
        """The variable that says the step it was saved at: `global_step` (TF1), `step`
        (tpurun), an optimizer's iterations; None when it has none."""
        for name in (GLOBAL_STEP, "step", "optimizer/iterations", "optimizer/_iterations"):
            variable = self.variables.get(name)
            if variable is not None and variable.dtype.is_integer and not variable.shape:
                return variable
        return None

    def step_in_name(self) -> int | None:
        """The step its name says (`model.ckpt-300`, `ckpt-300`), if it says one."""
        match = _STEP.fullmatch(storage.basename(self.prefix))
        return int(match.group(1)) if match else None

    def global_step(self) -> int | None:
        """The step the checkpoint was saved at (`step_variable`, read alone: a request on
        gs://), else the step in its name; None when neither says it."""
        variable = self.step_variable()
        if variable is None:
            return self.step_in_name()
        try:
            return int(self.reader.get_tensor(variable.key))
        except _DAMAGE + (tf.errors.OpError,) as e:
            raise read_failure(self.flag, self.given, e, self.prefix + ".data") from None


def open_source(path: str, flag: str) -> Source:
    """Finds the checkpoint `path` means and reads its .index, or raises one line.

    `flag`: where the path came from (`--warm_start_from`, `--checkpoint`), for errors.
    """
    path = path.rstrip("/") or path
    # A file of a checkpoint given for the checkpoint: its prefix.
    path = names.checkpoint_of(path) if names.is_checkpoint_file(storage.basename(path)) else path
    try:
        listed = storage.listdir(path)
    except tf.errors.OpError as e:
        raise read_failure(flag, path, e) from None
    if any(name.rstrip("/") in SAVED_MODEL_FILES for name in listed):
        prefix, origin = _saved_model(path, listed, flag), f"the variables of the SavedModel {path}"
    elif listed:
        prefix, origin = _newest_in(path, listed, flag)
    elif _exists(names.index_file(path), flag, path):
        prefix, origin = path, ""
    elif storage.isdir(path):
        raise UsageError(f"{flag}={path} is an empty directory: it holds no checkpoint")
    else:
        # --checkpoint also takes a step of the model_dir's own: a mistyped one lands here.
        own = " ckpt-N or its step N (of model_dir)," if flag == "--checkpoint" else ""
        raise UsageError(
            f"{flag}={path} is neither{own} a checkpoint (a prefix such as model.ckpt-100, "
            f"whose index is beside it: no {names.index_file(path)}), a model_dir nor a "
            "SavedModel directory"
        )
    reader = _reader(prefix, flag, path)
    graph = None
    if reader.has_tensor(OBJECT_GRAPH_KEY):
        try:
            graph = tf_internals.object_graph(reader, prefix)
        except _DAMAGE + (tf.errors.OpError,) as e:
            raise read_failure(flag, path, e, prefix + ".data") from None
    kind = Kind.OBJECTS if graph else Kind.NAMES
    directory = path if listed else (prefix.rpartition("/")[0] or ".")
    saved = prefix.endswith("/" + SAVED_MODEL_VARIABLES)
    variables = _variables(reader, graph)
    return Source(path, flag, prefix, kind, origin, directory, saved, variables, reader, graph)


def _exists(file: str, flag: str, path: str) -> bool:
    try:
        return tf.io.gfile.exists(file)
    except tf.errors.OpError as e:
        raise read_failure(flag, path, e) from None


def read_failure(flag: str, path: str, error: BaseException, prefix: str = "") -> TpurunError:
    """The one line for a source that could not be read: the storage's failure (a gs://
    request; exit 69 when it passes by itself), a file gone while it was read, or a
    damaged file (`prefix`: the checkpoint whose .index or .data it is)."""
    message = str(getattr(error, "message", None) or error)
    explained = storage_errors.explain(message, type(error).__name__)
    gone = isinstance(error, tf.errors.NotFoundError) or storage_errors.status_in(message) == 404
    if gone and (explained is None or "does not exist" not in explained):  # not the bucket
        where = storage_errors.path_in(message) or prefix or path
        return RunError(
            f"cannot read {flag}={path}: {where} disappeared while it was read (deleted or "
            "moved meanwhile?); nothing was taken from it"
        )
    if explained is not None:
        transient = storage_errors.is_transient(message, type(error).__name__)
        return (Unavailable if transient else RunError)(f"cannot read {flag}={path}: {explained}")
    if not prefix or not isinstance(error, _DAMAGE + (tf.errors.OpError,)):
        return RunError(f"cannot read {flag}={path}: {one_line(error, 200)}")
    return RunError(
        f"cannot read {flag}={path}: {prefix} is damaged or truncated ({one_line(error, 120)}); "
        "nothing was taken from it"
    )


def _saved_model(path: str, listed: list[str], flag: str) -> str:
    prefix = storage.join(path, SAVED_MODEL_VARIABLES)
    if "variables/" in listed or "variables" in listed:
        if _exists(names.index_file(prefix), flag, path):
            return prefix
    raise UsageError(
        f"{flag}={path} is a SavedModel without variables ({names.index_file(prefix)} is "
        "missing): "
        "there is nothing to take; give the checkpoint it was exported from"
    )


def _newest_in(path: str, listed: list[str], flag: str) -> tuple[str, str]:
    """The newest checkpoint of a model_dir, as its state file names it (looked for in the
    directory itself: a TPUEstimator's state file holds the absolute paths of where the
    run wrote, which a copied model_dir no longer is), else by the steps of the files."""
    prefixes = {names.checkpoint_of(n) for n in listed if names.is_index(n) and not n.endswith("/")}
    if STATE_FILE in listed:
        named = _named_by_state(path, flag)
        if named is not None:
            if named not in prefixes:
                raise UsageError(
                    f"{flag}={path}: its checkpoint file names {named}, which is not there "
                    f"(no {names.index_file(named)}); pass one of its checkpoints' prefixes "
                    "instead"
                    f" ({', '.join(sorted(prefixes)) or 'none'})"
                )
            return storage.join(path, named), f"the newest of {path}, as its {STATE_FILE} file says"
    stepped = {p: int(m.group(1)) for p in prefixes if (m := _STEP.fullmatch(p))}
    if not prefixes:
        raise UsageError(
            f"{flag}={path} holds no checkpoint (no {names.index_file('<name>')} file, no "
            "saved_model.pb); "
            "give a model_dir, a checkpoint prefix (model.ckpt-100) or a SavedModel directory"
        )
    if len(prefixes) > 1 and len(stepped) < len(prefixes):
        raise UsageError(
            f"{flag}={path} holds several checkpoints and no {STATE_FILE} file naming the "
            f"newest ({', '.join(sorted(prefixes))}); pass the prefix of the one to read"
        )
    newest = max(prefixes, key=lambda p: stepped.get(p, 0))
    return storage.join(path, newest), f"the newest of {path} by its step (no {STATE_FILE} file)"


def _named_by_state(path: str, flag: str) -> str | None:
    """The basename the `checkpoint` state file names as the newest (None: it names none,
    or is not a state file)."""
    file = storage.join(path, STATE_FILE)
    try:
        text = tf.io.gfile.GFile(file, "rb").read().decode("utf-8", "replace")
    except tf.errors.OpError as e:
        raise read_failure(flag, path, e) from None
    proto = tf_internals.checkpoint_state_proto()
    try:
        text_format.Parse(text, proto)
    except (text_format.ParseError, protobuf_message.DecodeError):
        return None
    return storage.basename(proto.model_checkpoint_path) or None


def _reader(prefix: str, flag: str, path: str) -> tf.train.CheckpointReader:
    try:
        # The reader of the prefix itself: tf.train.load_checkpoint first asks whether the
        # path is a directory (two more requests on gs://).
        return tf.compat.v1.train.NewCheckpointReader(prefix)
    except _DAMAGE + (tf.errors.OpError,) as e:
        raise read_failure(flag, path, e, names.index_file(prefix)) from None


def _variables(
    reader: tf.train.CheckpointReader, graph: tf_internals.ObjectGraph | None
) -> dict[str, SourceVariable]:
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    variables = {}
    for key in sorted(shapes):
        if graph is not None:
            if not key.endswith(VALUE_SUFFIX):
                continue  # the object graph, a Keras config: not a variable's value
            name = key[: -len(VALUE_SUFFIX)]
        else:
            name = key
        saved_as = graph.full_names.get(key, "") if graph else ""
        shape, dtype = tuple(shapes[key]), tf.as_dtype(dtypes[key])
        variables[name] = SourceVariable(name, key, shape, dtype, saved_as)
    return variables
