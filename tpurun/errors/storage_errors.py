"""What a failed Cloud Storage request means for the user, and the one line that says the fix.

TensorFlow's gs:// client reports every failure as "Error executing an HTTP
request: HTTP response code N ... when <doing what> gs://<path>" (or "All N retry
attempts failed"), which names neither the cause nor the fix. `explain` turns one
into "<what failed> at <path> (<HTTP status>): <fix>", keyed on the status:

  404 on a bucket     the bucket does not exist: create it or fix the path
  401, or anonymous   no credentials: gcloud auth application-default login
  403                 the identity lacks roles/storage.objectAdmin on the bucket
  5xx, 429, resets    storage unreachable or failing after TensorFlow's retries
  any other status    the request, its path and status, and to rerun

No TensorFlow import here (it works on the message): `commands.run` words every
TensorFlow error of a run with it, and `storage` the ones it reports itself.
"""

from __future__ import annotations

import re

_PATH = re.compile(r"gs://[^\s'\"]+")
_STATUS = re.compile(r"HTTP response code (\d{3})")
_BUCKET_MISSING = re.compile(r"The specified bucket (gs://[^\s'\"]+?)\.? was not found")
# TensorFlow's words for a request that never got an answer (its retries ran out).
_UNREACHABLE = (
    "libcurl code",
    "retry attempts failed",
    "Couldn't connect",
    "Could not resolve",
    "Connection reset",
    "timed out",
)
CREATE_BUCKET = "gcloud storage buckets create {bucket}"
ROLE = "roles/storage.objectAdmin"


def bucket_of(path: str) -> str:
    """'gs://b' of 'gs://b/x/y'."""
    return "gs://" + path[len("gs://") :].split("/", 1)[0]


def path_in(message: str) -> str | None:
    """The gs:// path a TensorFlow message names, if it names one."""
    match = _PATH.search(message)
    return match.group(0).rstrip(".,;:") if match else None


def status_in(message: str) -> int | None:
    """The HTTP status a TensorFlow message of a failed gs:// request names, if it names one."""
    match = _STATUS.search(" ".join(message.split()))
    return int(match.group(1)) if match else None


def missing_bucket(bucket: str, flag: str = "--model_dir") -> str:
    """The line for a bucket that does not exist (also said before anything is written)."""
    return (
        f"bucket {bucket} does not exist: create it ({CREATE_BUCKET.format(bucket=bucket)}) "
        f"or fix {flag}"
    )


def explain(message: str, type_name: str = "") -> str | None:
    """The one line for a failed gs:// request from its TensorFlow message; None if it is not one."""
    text = " ".join(message.split())
    missing = _BUCKET_MISSING.search(text)
    if missing:
        return missing_bucket(missing.group(1), "the path")
    path_match = _PATH.search(text)
    status_match = _STATUS.search(text)
    if path_match is None or (status_match is None and not _unreachable(text, type_name)):
        return None
    status = int(status_match.group(1)) if status_match else None
    return for_request(path_match.group(0).rstrip(".,;:"), status, text)


def for_request(path: str, status: int | None, text: str = "") -> str:
    """The line for a request on `path` that got HTTP `status` (None: no answer at all)."""
    bucket = bucket_of(path)
    got = f"HTTP {status}" if status else "no answer"
    if status == 401 or "Anonymous caller" in text:
        return (
            f"no Google Cloud credentials were accepted for {path} ({got}): run "
            "`gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), "
            f"or on a TPU VM give its service account {ROLE} on {bucket}"
        )
    if status == 403:
        return (
            f"permission denied on {path} ({got}): the identity tpurun runs as (`gcloud auth "
            "list`; on a TPU VM its service account; with a TPU node also the TPU's service "
            f"account service-<project number>@cloud-tpu.iam.gserviceaccount.com) needs {ROLE} "
            f"on {bucket}: gcloud storage buckets add-iam-policy-binding {bucket} "
            f"--member=<that identity> --role={ROLE}"
        )
    if status is None or status >= 500 or status in (408, 429):
        return (
            f"Cloud Storage is unreachable or failing at {path} ({got}, after TensorFlow's "
            "retries, GCS_RETRY_CONFIG_MAX_RETRIES): check the network and the storage "
            "status, then rerun the same command (a train resumes from its last checkpoint)"
        )
    return (
        f"a Cloud Storage request failed at {path} ({got}); rerun the same command, and if it "
        f"fails again check that {bucket} exists and that you can write it"
    )


def is_transient(message: str, type_name: str = "") -> bool:
    """Whether a failed gs:// request was storage unreachable or failing (5xx, 408, 429, no
    answer) after TensorFlow's retries: a failure that passes by itself."""
    text = " ".join(message.split())
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        return code >= 500 or code in (408, 429)
    return _unreachable(text, type_name)


def _unreachable(text: str, type_name: str) -> bool:
    return type_name in ("UnavailableError", "DeadlineExceededError", "AbortedError") or any(
        words in text for words in _UNREACHABLE
    )
