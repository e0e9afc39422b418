"""The ``object`` backend's faults: S3 errors as BackendErrors naming endpoint and bucket.

obstore's errors carry the HTTP status and S3's error code in their text;
:meth:`Bucket.fault` says what they mean (a missing bucket, refused
credentials, none found), and no message repeats a secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvtier.spec import BackendError

__all__ = ["Bucket", "first_line"]

_STATUS_RE = re.compile(r"status code: (\d{3})")
_CODE_RE = re.compile(r"<Code>(\w+)</Code>")
#: In the URLs of AWS's instance metadata (IMDS) and container credential services.
_METADATA_RE = re.compile(r"169\.254\.170\.2|/latest/api/token|/latest/meta-data/")


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Bucket:
    """A tier's bucket, as its messages name it."""

    name: str = ""
    endpoint: str = ""
    where: str = ""  # s3://<bucket>/<prefix> at <endpoint>
    secrets: tuple[str, ...] = ()  # shown as *** wherever they would appear
    #: Whether access keys were configured (options or AWS_* variables); without
    #: them obstore asks the cloud's metadata service, which fails off the cloud.
    keys: bool = True

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def fault(self, exc: Exception, op: str) -> BackendError:
        """A BackendError naming endpoint and bucket, saying what the server meant."""
        text = str(exc)
        status = _STATUS_RE.search(text)
        code = _CODE_RE.search(text)
        detail = self.scrub(first_line(exc))
        # a PUT answered 404 means the bucket is gone: objects are never missing there
        if (code is not None and code.group(1) == "NoSuchBucket") or (
            op == "put" and isinstance(exc, FileNotFoundError)
        ):
            return BackendError(
                f"object tier ({op}): bucket {self.name!r} does not exist at {self.endpoint}"
            )
        if not self.keys and _METADATA_RE.search(text):
            # the failure is the credential lookup's, not the endpoint's answer
            return BackendError(
                f"object tier ({op}): no credentials found for bucket {self.name!r} at "
                f"{self.endpoint}: set the tier's access_key_id and secret_access_key, or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the cloud metadata service, "
                f"asked next, failed: {detail})"
            )
        if status is not None and status.group(1) in ("401", "403"):
            why = code.group(1) if code is not None else f"HTTP {status.group(1)}"
            return BackendError(
                f"object tier ({op}): {self.endpoint} refused the credentials for bucket "
                f"{self.name!r} ({why})"
            )
        return BackendError(f"object tier {self.where}: {op} failed: {detail}")
