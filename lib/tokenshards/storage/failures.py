"""What went wrong with a store, said in one line: the one place a store's failure is worded
(``storage_error``), for every command and every store.

The line names what was being done and the URL as the user wrote it, then what happened in words a
user can act on: a refusal names the store, the bucket (container) and the kind of credential that
was sent (never its value: ``clients.credential_sent``); a failure the retry policy gave up on says
how many tries it had. The library's own words follow in brackets, short, with the endpoint.
Credentials never reach the line: ``UserError`` scrubs every message (``wording.scrub``).
"""
from __future__ import annotations

import errno

import fsspec

from ..errors import UserError
from .clients import bucket_of, credential_sent, is_azure, is_gcs, is_object_store, is_s3, store_name
from .retry import TRANSIENT_STATUSES, status_of, transient

REFUSED_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                           "TokenRefreshRequired", "AuthenticationFailed", "InvalidAuthenticationInfo",
                           "AuthenticationError"})
"""Error codes (S3's, Azure's) that say the credential itself was not accepted, not that it lacks a right."""


def _is_denied(e: BaseException) -> bool:
    """401 or 403 on any store: S3 and Azure (through adlfs) raise PermissionError, gcsfs an OSError
    "Forbidden", azure-core a ClientAuthenticationError or an HttpResponseError with its status."""
    status, _ = status_of(e)
    return (status in (401, 403) or isinstance(e, PermissionError) or str(e).startswith("Forbidden")
            or type(e).__name__ == "ClientAuthenticationError")


def _is_auth_failure(e: BaseException) -> bool:
    """The credentials themselves were refused (a wrong key or token), not a missing right."""
    status, _ = status_of(e)
    return status == 401 or _error_code(e) in REFUSED_CODES or "failed to authenticate" in str(e)


def _error_code(e: BaseException) -> str | None:
    """The store's own error code: Azure's ``error_code``, S3's ``Error.Code`` (on s3fs's cause)."""
    for err in (e, e.__cause__):
        code = getattr(err, "error_code", None)
        if code:
            return str(getattr(code, "value", code))  # azure-core's codes are enums
        reply = getattr(err, "response", None)
        code = (reply.get("Error") or {}).get("Code") if isinstance(reply, dict) else None
        if code and not str(code).isdigit():  # botocore names a bodiless answer (a HEAD's) by its status
            return code
    return None


def read_failure(e: BaseException, url: str, fs: fsspec.AbstractFileSystem) -> UserError | None:
    """The one-line error for a failed read of an input on an object store when the store failed
    (an outage the retry policy gave up on, a refusal, a reset), not the file's bytes; else None.

    The file's bytes failing is Arrow's own error (ArrowInvalid: not parquet, a bad page); the
    store's failure reaches Arrow through the file object and comes out as the OSError s3fs, gcsfs
    or adlfs raised. ``--on-bad-file skip`` leaves out bad files, never a store's bad minute: the
    run stops, and the same command resumes once the store answers."""
    import pyarrow as pa  # only the readers of inputs need it

    if not isinstance(e, OSError) or isinstance(e, (pa.ArrowException, FileNotFoundError)) or not is_object_store(fs):
        return None
    return storage_error(e, url, what="cannot read", fs=fs)


def storage_error(e: BaseException, url: str, *, what: str, fs: fsspec.AbstractFileSystem | None = None) -> UserError:
    """A one-line ``UserError`` for a storage failure on ``url``, saying what to check."""
    name = type(e).__name__
    cloud = "gcs" if fs is not None and is_gcs(fs) else "azure" if fs is not None and is_azure(fs) else "s3"
    status, _ = status_of(e)
    if fs is not None and (_is_denied(e) or (cloud == "s3" and status == 400 and _error_code(e) in (None, *REFUSED_CODES))):
        hint = refusal(e, fs, url)
    elif isinstance(e, PermissionError):
        hint = "access denied; check the credentials in use (AWS_PROFILE, AWS_ACCESS_KEY_ID, instance role) and the bucket policy"
    elif isinstance(e, FileNotFoundError):
        hint = "not found"
    elif name == "NoCredentialsError":
        hint = ("no AWS credentials found on the machine that read it (on a cluster, check that every worker has "
                "credentials); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or pass --storage-option "
                "anon=true for a public bucket")
    elif name == "TransportError" and fs is not None:  # google-auth: the token endpoint, not the store, failed
        hint = (f"cannot get an access token for the credentials sent, {credential_sent(fs)}: their token endpoint "
                f"did not answer ({_tries(fs)}); check the network, and the token_uri of the credentials file")
    elif transient(e) is not None:
        tries = _tries(fs)
        if status in TRANSIENT_STATUSES or status is not None:
            hint = (f"{_store(fs, cloud)} kept answering {status}{_code(e)} ({tries}): it is overloaded or failing; "
                    "try again later (--storage-option retry='{\"attempts\": ...}' tries longer)")
        else:
            hint = (f"cannot reach the storage endpoint ({tries}: refused, reset, cut short or no answer); "
                    f"check {_CLOUD_ENDPOINT[cloud]}, and the network")
    else:
        hint = "check the URL, the credentials and the endpoint"
    endpoint = _endpoint(fs)
    return UserError(f"{what} {url}: {hint} ({name}: {_detail(e, fs)}{f'; endpoint {endpoint}' if endpoint else ''})")


def refusal(e: BaseException, fs: fsspec.AbstractFileSystem, url: str) -> str:
    """A 401 or 403, in words: which store refused what credential for which bucket, and what to check.
    Never retried (``retry``): a refusal is said as soon as it comes."""
    cloud = "gcs" if is_gcs(fs) else "azure" if is_azure(fs) else "s3"
    kind = "container" if cloud == "azure" else "bucket"
    bucket = bucket_of(fs._strip_protocol(url)) if "://" in url else bucket_of(url)
    sent = credential_sent(fs)
    status, _ = status_of(e)
    said = f"{status or 403}{_code(e)}"
    if sent.startswith("no credentials"):
        return (f"{_store(fs, cloud)} refused an anonymous request for {kind} {bucket!r} ({said}): {sent}; "
                f"give credentials: {_CLOUD_CREDENTIALS[cloud]}")
    if status in (400, 403) and _error_code(e) is None and cloud == "s3":  # a HEAD's: no body says which
        return (f"S3 refused the request for {kind} {bucket!r} ({status}, without a reason: the answer to a HEAD has "
                f"no body): {sent}; the credentials were not accepted (an expired session token is answered "
                f"400), or they lack a permission this needs: check {_CLOUD_CREDENTIALS[cloud]}, and the bucket's "
                "and the IAM policies")
    if type(e.__cause__).__name__ == "RefreshError":  # gcsfs's 401 for a token Google would not grant
        return (f"Google's token endpoint refused the credentials sent for {kind} {bucket!r}: {sent} "
                f"({_one_line(e.__cause__)}); check {_CLOUD_CREDENTIALS[cloud]}")
    if _is_auth_failure(e):
        return (f"{_store(fs, cloud)} refused the credentials sent for {kind} {bucket!r} ({said}): {sent}; "
                f"check {_CLOUD_CREDENTIALS[cloud]}")
    return (f"access denied: {_store(fs, cloud)} accepted the credentials sent for {kind} {bucket!r} ({said}), {sent}, "
            f"but they lack a permission this needs; check that the credentials in use {_CLOUD_RIGHTS[cloud]}")


def _store(fs, cloud: str) -> str:
    return store_name(fs) if fs is not None else cloud.upper()


def _code(e: BaseException) -> str:
    code = _error_code(e)
    return f" {code}" if code else ""


def _tries(fs) -> str:
    policy = getattr(fs, "retry_policy", None)
    return f"tried {policy.attempts} times" if policy is not None else "tried again and again"


def _detail(e: BaseException, fs: fsspec.AbstractFileSystem | None = None) -> str:
    """The error's own words, short: azure-core's errors carry the whole XML reply after the message;
    a file s3fs or adlfs could not find is named as the user writes it (``s3://bucket/key``)."""
    code = getattr(e, "error_code", None)
    if code and hasattr(e, "reason"):
        return f"{_one_line(Exception(str(e).splitlines()[0]))} (ErrorCode {getattr(code, 'value', code)})"
    text = _one_line(e)
    if text == type(e).__name__ and e.__cause__ is not None:  # fsspec's FSTimeoutError says nothing itself
        text = f"{type(e.__cause__).__name__}: {_one_line(e.__cause__)}"
    if fs is not None and isinstance(e, FileNotFoundError):
        path = e.filename if isinstance(e.filename, str) else e.args[0] if len(e.args) == 1 else None
        if isinstance(path, str) and path and "://" not in path and " " not in path:
            text = text.replace(path, fs.unstrip_protocol(path))
    return text


_CLOUD_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_PROFILE or --storage-option key=/secret=",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login or --storage-option "
           "gcs='{\"token\": ...}' (an access token expires after an hour)",
    "azure": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY "
             "(or AZURE_STORAGE_SAS_TOKEN, or --storage-option azure='{...}')",
}
_CLOUD_RIGHTS = {
    "s3": "(AWS_PROFILE, AWS_ACCESS_KEY_ID, the instance role) may read and write there: the bucket policy, the IAM policy",
    "gcs": "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, the VM's service account, "
           "--storage-option gcs='{\"token\": ...}') have the storage.objects.* permissions on the bucket",
    "azure": "(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME/..._KEY, a SAS token, an Azure AD identity) "
             "may read and write blobs in the container",
}
_CLOUD_ENDPOINT = {
    "s3": "AWS_ENDPOINT_URL or --storage-option endpoint_url=...",
    "gcs": "STORAGE_EMULATOR_HOST or --storage-option gcs='{\"endpoint_url\": ...}'",
    "azure": "the account name or the connection string's BlobEndpoint",
}


def _endpoint(fs: fsspec.AbstractFileSystem | None) -> str | None:
    """The endpoint a filesystem's client talks to, wherever it came from (--storage-option, the
    environment or the cloud's default): the first thing to check when it is the wrong one."""
    if fs is None:
        return None
    if is_gcs(fs):
        return getattr(fs, "_location", None)
    if is_azure(fs):
        url = getattr(getattr(fs, "service_client", None), "primary_endpoint", None)
        return url.split("?", 1)[0].rstrip("/") if url else None  # never a SAS token
    if not is_s3(fs):
        return None
    client = getattr(fs, "s3", None)
    return getattr(getattr(client, "meta", None), "endpoint_url", None)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] or type(e).__name__


def write_advice(e: BaseException, option: str) -> str:
    """What to do when a local folder refused a write: a full disk is not a permissions problem."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"free some space there or choose another {option}"
    return f"choose another {option} or fix its permissions"
