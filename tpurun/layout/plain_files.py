"""A model_dir's files read and written without TensorFlow: os on a local disk, gcsfs on gs://.

For what works before TensorFlow loads, or without it: `tpurun report` and the
supervisor list a model_dir and read its run records (`listdir`, `read_record`); the
supervisor writes the record of a trainer that left none (`create_new`); the trainer
lease on gs:// is one object, created only if there is none and replaced only at the
generation its holder read (`GcsObjects`). Everything else tpurun writes into a
model_dir goes through `tpurun.storage` (TensorFlow's file systems). The same rules:
exclusive creation, never through a symbolic link, never over a file that is there.
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import stat
from typing import Any

from tpurun.errors import storage_errors
from tpurun.layout import names

# A record is a few kB (a save adds ~80 bytes to a train's): anything this large is not one.
MAX_RECORD_BYTES = 64 << 20
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}
_BOUNDARY = "tpurun-object"


def is_local(path: str) -> bool:
    """A path on this machine's disk (no `scheme://`): the only kind with symbolic links."""
    return "://" not in path


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine is running (this process is)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def gcs() -> Any:
    """gcsfs's file system for gs:// (only for gs:// model_dirs: it brings aiohttp)."""
    import gcsfs

    # gcsfs logs a traceback for every failed request; tpurun says it in one line.
    std_logging.getLogger("gcsfs").setLevel(std_logging.CRITICAL)
    # A GCS emulator (STORAGE_EMULATOR_HOST, as the Cloud SDK's) takes no credentials;
    # asking Google's for them there would only log failed metadata-server probes.
    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    return gcsfs.GCSFileSystem(token="anon" if emulated else None)


class Unreadable(Exception):
    """A path that is no record tpurun wrote, or cannot be read: why, as a phrase about it
    ('is a directory, not a record')."""


def read_record(path: str) -> bytes | None:
    """The bytes of the record at `path` (None: there is none); Unreadable when it is not a
    regular file, cannot be read or is larger than MAX_RECORD_BYTES."""
    try:
        if path.startswith("gs://"):
            with gcs().open(path, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        else:
            kind = stat.S_IFMT(os.stat(path).st_mode)  # through a link: what a read reaches
            if kind != stat.S_IFREG:  # a pipe would block the read for ever
                raise Unreadable(f"is {_KINDS.get(kind, 'not a regular file')}, not a record")
            with open(path, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Unreadable(f"cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_RECORD_BYTES:
        raise Unreadable(f"is larger than {MAX_RECORD_BYTES >> 20} MiB, not a record")
    return data


def listdir(directory: str) -> list[str]:
    """The names in `directory` ([] if there is none); the OSError of a failed listing
    (NotADirectoryError: a file)."""
    try:
        if directory.startswith("gs://"):
            return [names.basename(p) for p in gcs().ls(directory, refresh=True)]
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def create_new(path: str, text: str) -> bool:
    """Writes a new file `path` holding `text`, never over a file that is there and only into
    a directory that exists and is no symbolic link; whether `path` now holds a record
    (written, or on gs:// one there already). Never raises."""
    try:
        if path.startswith("gs://"):  # an object upload is atomic by itself
            try:
                GcsObjects().write(path, text, "0")
            except FileExistsError:
                pass
            return True
        directory = os.path.dirname(path)
        if os.path.islink(directory) or not os.path.isdir(directory):
            return False
        temporary = names.temporary_path(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o644), "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(temporary, path)  # never over a file that is there
        finally:
            os.unlink(temporary)
    except Exception:  # noqa: BLE001 - the callers' records are no reason to fail a job
        return False
    return True


class GcsObjects:
    """Conditional requests on one gs:// object, through gcsfs (the GCS JSON API):
    TensorFlow's client cannot make a write conditional."""

    def __init__(self) -> None:
        self._fs = gcs()

    def write(self, path: str, text: str, generation: str) -> str:
        """Uploads `text` only if the object's generation is `generation` ("0": none); the new one.

        FileExistsError (HTTP 412) when it is not.
        """
        bucket, name = _parts(path)
        upload = self._fs.base.replace("/storage/v1/", "/upload/storage/v1/") + "b/{}/o"
        # A multipart upload (metadata, then the data), as gcsfs's own: the emulator
        # ignores preconditions on the simpler uploadType=media.
        body = (
            f"--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            + json.dumps({"name": name})
            + f"\r\n--{_BOUNDARY}\r\nContent-Type: application/json\r\n\r\n"
            + text
            + f"\r\n--{_BOUNDARY}--"
        )
        answer = self._call(
            path,
            "POST",
            upload,
            bucket,
            uploadType="multipart",
            ifGenerationMatch=generation,
            data=body.encode(),
            headers={"Content-Type": f'multipart/related; boundary="{_BOUNDARY}"'},
            json_out=True,
        )
        return str(answer["generation"])

    def read(self, path: str) -> tuple[bytes, str] | None:
        """(the object's bytes, its generation); None if there is none."""
        bucket, name = _parts(path)
        try:
            info = self._call(path, "GET", "b/{}/o/{}", bucket, name, json_out=True)
            data = self._call(
                path, "GET", "b/{}/o/{}", bucket, name, alt="media", generation=info["generation"]
            )[1]
        except FileNotFoundError:
            return None
        return data, str(info["generation"])

    def delete(self, path: str, generation: str) -> None:
        """Deletes the object if it is still at `generation`; else (gone, replaced) leaves it."""
        bucket, name = _parts(path)
        try:
            self._call(path, "DELETE", "b/{}/o/{}", bucket, name, ifGenerationMatch=generation)
        except (FileNotFoundError, FileExistsError):
            pass

    def _call(self, path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._fs.call(method, *args, **kwargs)
        except (FileNotFoundError, FileExistsError):
            raise
        except Exception as e:  # noqa: BLE001 - gcsfs raises OSError, HttpError, aiohttp's errors
            # gcsfs's HttpError has the status; a 403 is an OSError("Forbidden: ...").
            status = getattr(e, "code", None) or (403 if "Forbidden" in str(e) else None)
            raise OSError(storage_errors.for_request(path, status, str(e))) from None


def _parts(path: str) -> tuple[str, str]:
    bucket, _, name = path[len("gs://") :].partition("/")
    return bucket, name
