"""Each object store's fsspec filesystem, made to send every request through the one retry policy
(``retry``), and what kind of credential each one sends (for the error that says it was refused).

- S3: s3fs's ``_call_s3`` is the door of every request (listings' pages too, in s3fs 2026.9). Ours
  runs it under the policy, with botocore's own retries off (one try per call) and s3fs's loop
  around reading a body reduced to one try: an object's body is read inside the try, so a body cut
  short is retried like a reset.
- GCS: gcsfs's ``_request`` is the door; its decorator retries (a 401 "Invalid Credentials" too,
  logging a traceback each time) are replaced by the policy, which sees the reply's headers
  (Retry-After) before gcsfs turns the reply into an exception. Its errors name the object as the
  user wrote it (``gs://bucket/key``), not as the JSON API's path.
- Azure: the policy is the SDK pipeline's retry policy (every client adlfs makes shares the
  pipeline); it reads each reply's body inside the try, so a reset inside a 404's body (the SDK
  reads it after the pipeline, raising ``IncompleteReadError``) is retried like any reset.

Each process builds its own filesystems from (URL, storage options); the classes are made once per
process, so fsspec's instance cache finds a filesystem again.
"""
from __future__ import annotations

import io
import posixpath
import re
from urllib.parse import unquote

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .retry import TRANSIENT_STATUSES, RetryPolicy, Transient, retried, retry_after, transient

USER_AGENT = "tokenshards"

S3_PROTOCOLS = ("s3", "s3a")
GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")

_CLASSES: dict[tuple[str, type | None], type] = {}


# -- which store ---------------------------------------------------------------------------------------

def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in _protocols(fs)


def is_gcs(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in GCS_PROTOCOLS for p in _protocols(fs))


def is_azure(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in AZURE_PROTOCOLS for p in _protocols(fs))


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    """S3, GCS or Azure: the stores whose single small writes are atomic and whose large ones we commit."""
    return is_s3(fs) or is_gcs(fs) or is_azure(fs)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)



def store_name(fs) -> str:
    """How messages name the store ``fs`` reaches."""
    return "S3" if is_s3(fs) else "GCS" if is_gcs(fs) else "Azure" if is_azure(fs) else type(fs).__name__


# -- S3 ---------------------------------------------------------------------------------------------

def s3_filesystem(url: str, options: dict, policy: RetryPolicy):
    cls = _class("s3", None)
    config = dict(options.pop("config_kwargs", None) or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})  # the policy retries
    config.setdefault("connect_timeout", policy.timeout)
    config.setdefault("read_timeout", policy.timeout)
    fs = cls(retry_policy=policy, config_kwargs=config, **options)
    return fs, cls._strip_protocol(url)


def _s3_class():
    from botocore.exceptions import ClientError
    from s3fs import S3FileSystem
    from s3fs.errors import translate_boto_error

    class TokenshardsS3FileSystem(S3FileSystem):
        retries = 1
        """s3fs's own loops (around reading a body, around a call): one try, ours retries."""

        def __init__(self, *args, retry_policy: RetryPolicy, **kwargs):
            self.retry_policy = retry_policy
            super().__init__(*args, **kwargs)

        def __reduce__(self):
            return _rebuilt, ("s3", None, self.storage_args, self.storage_options)

        async def _call_s3(self, method, *akwarglist, **kwargs):
            await self.set_session()
            s3 = await self.get_s3(kwargs.get("Bucket"))
            call = getattr(s3, method)
            params = self._get_s3_method_kwargs(call, *akwarglist, **kwargs)

            async def once():
                reply = await call(**params)
                if "Body" in reply and hasattr(reply["Body"], "read"):  # a GET: its body is part of the answer
                    body = reply["Body"]
                    try:
                        reply["Body"] = _ReadBody(await body.read())
                    finally:
                        body.close()
                return reply

            try:
                return await retried(self.retry_policy, once)
            except ClientError as e:
                raise translate_boto_error(e) from e

        call_s3 = fsspec.asyn.sync_wrapper(_call_s3)  # s3fs's wraps its own ``_call_s3``, not an override

    return TokenshardsS3FileSystem


class _ReadBody:
    """An S3 object's body, already read whole: what s3fs reads from after ``_call_s3``."""

    def __init__(self, data: bytes):
        self._data = io.BytesIO(data)

    async def read(self, amt: int = -1) -> bytes:
        return self._data.read(-1 if amt is None else amt)

    def close(self) -> None:
        pass


# -- GCS --------------------------------------------------------------------------------------------

def gcs_filesystem(url: str, options: dict, policy: RetryPolicy):
    """gcsfs's own class when an endpoint is named (an emulator, a private endpoint): the class
    gcsfs registers by default first asks a gRPC control API for each bucket's type, which only
    Google's endpoint answers (elsewhere it waits 60 s per bucket, then falls back to this one)."""
    if options.get("endpoint_url"):
        from gcsfs.core import GCSFileSystem as base
    else:
        base = fsspec.get_filesystem_class("gs")
    cls = _class("gcs", base)
    fs = cls(retry_policy=policy, **options)
    return fs, fs._strip_protocol(url)


def _gcs_class(base: type):
    import aiohttp
    from gcsfs.retry import HttpError, validate_response

    class TokenshardsGCSFileSystem(base):
        def __init__(self, *args, retry_policy: RetryPolicy, **kwargs):
            self.retry_policy = retry_policy
            super().__init__(*args, **kwargs)

        def __reduce__(self):
            return _rebuilt, ("gcs", base, self.storage_args, self.storage_options)

        async def _request(self, method, path, *args, headers=None, json=None, data=None, cache_type=None,
                           cache_source=None, **kwargs):
            """gcsfs's ``_request`` under the policy (a copy of its body: the decorator around it is what
            goes); a reply that says "try again" is judged with its headers, before gcsfs words it."""
            timeout = self.requests_timeout or aiohttp.ClientTimeout(sock_connect=self.retry_policy.timeout,
                                                                     sock_read=self.retry_policy.timeout)

            async def once():
                await self._set_session()
                if hasattr(data, "seek"):
                    data.seek(0)
                async with self.session.request(
                        method=method, url=self._format_path(path, args), params=self._get_params(kwargs), json=json,
                        headers=self._get_headers(headers, cache_type=cache_type, cache_source=cache_source),
                        data=data, timeout=timeout) as r:
                    status, reply_headers, info = r.status, r.headers, r.request_info
                    contents = await r.read()
                if status in TRANSIENT_STATUSES:
                    error = HttpError({"code": status, "message": _gcs_message(contents)})
                    error.headers = reply_headers
                    raise error
                try:
                    validate_response(status, contents, self._shown(path, args, kwargs))
                except Exception as error:
                    error.status_code = status  # gcsfs words 403 as an OSError "Forbidden": the status stays known
                    raise
                return status, reply_headers, info, contents

            return await retried(self.retry_policy, once)

        def _shown(self, path: str, args: tuple, params: dict) -> str:
            """The object (or bucket) a JSON API request is about, as the user writes it (``gs://b/key``),
            not as the API names it (``.../download/storage/v1/b/b/o/key%2F...``)."""
            found = _GCS_API_PATH.search(self._format_path(path, args).split("?", 1)[0])
            if found is None:
                return self._format_path(path, args).split("?", 1)[0]
            bucket, key = unquote(found.group(1)), unquote(found.group(2) or params.get("name") or "")
            return f"gs://{bucket}/{key}" if key else f"gs://{bucket}"

    return TokenshardsGCSFileSystem


_GCS_API_PATH = re.compile(r"(?:^|/)b/([^/]+)(?:/o(?:/(.+))?)?$")
"""The bucket and object in a JSON API URL (``.../storage/v1/b/B/o/K``, uploads' ``.../b/B/o``)."""


def _gcs_message(contents: bytes) -> str:
    import json

    try:
        error = json.loads(contents)["error"]
        return error if isinstance(error, str) else str(error.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return contents.decode("utf-8", "replace")[:200]


# -- Azure ------------------------------------------------------------------------------------------

def azure_filesystem(url: str, options: dict, policy: RetryPolicy):
    fs = _class("azure", None)(retry_policy=policy, **options)
    return fs, fs._strip_protocol(url)


def _azure_class():
    from adlfs import AzureBlobFileSystem

    class TokenshardsAzureBlobFileSystem(AzureBlobFileSystem):
        def __init__(self, *args, retry_policy: RetryPolicy, **kwargs):
            self.retry_policy = retry_policy
            super().__init__(*args, **kwargs)

        def __reduce__(self):
            return _rebuilt, ("azure", None, self.storage_args, self.storage_options)

        def do_connect(self):
            super().do_connect()
            self.service_client = _with_policy(self.service_client, self.retry_policy)

    return TokenshardsAzureBlobFileSystem


STORAGE_RETRY_OPTIONS = ("retry_total", "retry_connect", "retry_read", "retry_status", "retry_to_secondary", "hosts",
                         "retry_hook", "retry_backoff_factor", "retry_backoff_max", "retry_on_methods")
"""Per-request options azure-storage-blob's retry policy (``StorageRetryPolicy.configure_retries``) consumes."""


def _with_policy(client, policy: RetryPolicy):
    """The same service client (account URL, credential) whose pipeline retries by ``policy``."""
    from azure.core.pipeline.policies import AsyncHTTPPolicy
    from azure.storage.blob.aio import BlobServiceClient

    class RetryAnswer(Exception):
        def __init__(self, response):
            super().__init__(response.http_response.status_code)
            self.response = response

    def judge(e: BaseException) -> Transient | None:
        if isinstance(e, RetryAnswer):
            return Transient(retry_after(e.response.http_response.headers))
        return transient(e)

    class PolicyRetry(AsyncHTTPPolicy):
        """The pipeline's retry step: every try whole (its reply's body read) before it counts."""

        async def send(self, request):
            # What the SDK's own retry policy takes out of each request's options (retry settings, the
            # secondary location), so that none reaches the transport; replies say where they came from.
            options = request.context.options
            for name in STORAGE_RETRY_OPTIONS:
                options.pop(name, None)
            mode = options.pop("location_mode", None) or "primary"
            body = request.http_request.body
            try:
                start = body.tell() if hasattr(body, "seek") else None
            except (OSError, ValueError):
                start = None

            async def once():
                if start is not None:
                    body.seek(start)
                response = await self.next.send(request)
                reply = response.http_response
                if not getattr(reply, "is_stream_consumed", True):  # a streamed reply (a blob's body, an error's)
                    await reply.read()
                reply.location_mode = mode
                if reply.status_code in TRANSIENT_STATUSES:
                    raise RetryAnswer(response)
                return response

            try:
                return await retried(policy, once, judge=judge)
            except RetryAnswer as e:  # still "try again" after the last try: the SDK words the answer
                return e.response

    return BlobServiceClient(account_url=client.url, credential=client.credential, user_agent=USER_AGENT,
                             retry_policy=PolicyRetry(), connection_timeout=policy.timeout, read_timeout=policy.timeout)


def _rebuilt(store: str, base: type | None, args: tuple, kwargs: dict):
    """A pickled filesystem of ours, made again in this process (its class is made per process)."""
    return _class(store, base)(*args, **kwargs)


def _class(store: str, base: type | None) -> type:
    key = (store, base)
    if key not in _CLASSES:
        _CLASSES[key] = _s3_class() if store == "s3" else _gcs_class(base) if store == "gcs" else _azure_class()
    return _CLASSES[key]


# -- what credential a filesystem sends -----------------------------------------------------------------

def credential_sent(fs) -> str:
    """What kind of credential ``fs`` sends with its requests, and where it came from, never its value:
    for the line that says a store refused it."""
    try:
        if is_s3(fs):
            return _s3_credential(fs)
        if is_gcs(fs):
            return _gcs_credential(fs)
        return _azure_credential(fs)
    except Exception:  # noqa: BLE001 -- only ever a description: never the reason a command fails
        return "credentials of an unknown kind"


_BOTO_METHODS = {
    "env": "an access key from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "shared-credentials-file": "an access key from the shared credentials file (~/.aws/credentials, AWS_PROFILE)",
    "config-file": "an access key from the AWS config file (AWS_PROFILE)",
    "iam-role": "the instance's IAM role",
    "container-role": "the container's IAM role",
    "assume-role": "an assumed role (AWS_PROFILE's role_arn)",
    "assume-role-with-web-identity": "a web-identity role (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE)",
    "sso": "AWS SSO credentials (AWS_PROFILE)",
    "custom-process": "credentials from the profile's credential_process",
}


def _s3_credential(fs) -> str:
    if getattr(fs, "anon", False):
        return "no credentials (anon=true)"
    session_token = " with a session token" if getattr(fs, "token", None) else ""
    if getattr(fs, "key", None) or getattr(fs, "secret", None):
        return f"an access key from --storage-option key/secret{session_token}"
    signer = getattr(getattr(fs, "_s3", None), "_request_signer", None)
    credentials = getattr(signer, "_credentials", None)
    if credentials is None:
        return "no credentials (none were found)"
    method = getattr(credentials, "method", "") or ""
    token = " with a session token" if getattr(credentials, "token", None) else ""
    if method == "explicit":
        return f"an access key from --storage-option client_kwargs{token}"
    return _BOTO_METHODS.get(method, f"credentials botocore found ({method or 'unknown source'})") + \
        (token if method in ("env", "shared-credentials-file", "config-file") else "")


def _gcs_credential(fs) -> str:
    credentials = getattr(getattr(fs, "credentials", None), "credentials", None)
    if credentials is None:
        return "no credentials (anonymous: token=anon, or none were found)"
    kind = type(credentials).__module__ + "." + type(credentials).__name__
    if kind.startswith("google.oauth2.service_account"):
        return f"the key of service account {getattr(credentials, 'service_account_email', '?')}"
    if kind.startswith("google.auth.compute_engine"):
        return "the VM's service account (from the metadata server)"
    if kind.startswith("google.oauth2.credentials"):
        if getattr(credentials, "refresh_token", None):
            return "authorized-user credentials (gcloud auth application-default login, or such a JSON file)"
        return "an access token given as the token option"
    return f"credentials of type {type(credentials).__name__}"


def _azure_credential(fs) -> str:
    account = getattr(fs, "account_name", None) or getattr(getattr(fs, "service_client", None), "account_name", None)
    of = f" of account {account}" if account else ""
    connection = getattr(fs, "connection_string", None)
    if connection:
        parts = {p.split("=", 1)[0].strip().lower() for p in connection.split(";") if "=" in p}
        if "accountkey" in parts:
            return f"the account key{of} in a connection string"
        if "sharedaccesssignature" in parts:
            return f"a SAS token{of} in a connection string"
        return f"a connection string without a key{of}"
    if getattr(fs, "credential", None) is not None:
        return f"an Azure AD credential ({type(fs.credential).__name__}){of}"
    if getattr(fs, "account_key", None):
        return f"the account key{of}"
    if getattr(fs, "sas_token", None):
        return f"a SAS token{of}"
    return f"no credentials (anonymous){of}"


def bucket_of(path: str) -> str:
    """The bucket (container) of a path as fsspec names it (``bucket/key``)."""
    return unquote(posixpath.normpath(path.lstrip("/")).split("/", 1)[0])
