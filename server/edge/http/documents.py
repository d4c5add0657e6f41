"""Document files over HTTP: DeepL's /v2/document, LibreTranslate's /translate_file, the native /v1/files.

    POST /v2/document                 multipart: file, target_lang, source_lang?, formality?, output_format?,
                                      filename? -> {"document_id", "document_key"}
    GET|POST /v2/document/{id}        document_key -> {"document_id", "status": queued|translating|done|error,
                                      "seconds_remaining", "billed_characters", "error_message"}
    GET|POST /v2/document/{id}/result document_key -> the file (503 until done), then it is deleted
    POST /translate_file              multipart: file, source (or auto), target, api_key
                                      -> {"translatedFileUrl"} once translated (LibreTranslate answers late too)
    GET /download_file/{name}         the file, then it is deleted
    POST /v1/files                    multipart: file, target_language, source_language? -> the job
    GET /v1/files/{id}                the job: status, segmentsDone/segmentsTotal, secondsRemaining, ...
    GET /v1/files/{id}/content        the file (then deleted); DELETE /v1/files/{id} drops the job

Every file is checked and read before the upload is answered (server/files/: type, size, zip bombs,
XML entities, encryption), so a bad file gets the API's 400 at once; translation runs in the
background (server/files/jobs.py) through the same Translate path as any request, with the
uploader's key. A DeepL status request for an unfinished job waits up to STATUS_WAIT_S for it to
finish (DeepL's clients poll every 5 s). Errors are each API's own shape (DeepL {"message"}, LibreTranslate {"error"},
native google.rpc.Status). The process that took an upload translates it; with --frontends N > 1 any
of them answers its status and download from the shared spool directory (server/files/spool.py).
"""
from __future__ import annotations

import re
from typing import Optional
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protos.nmt.v1 import translator_pb2 as pb
from server.core.errors import ServiceError
from server.files import LIMITS, FileError
from server.files.jobs import Full, Job, JobFailed, Jobs
from server.edge.http import deepl, libre
from server.edge.http.body import BadParam, BodyError, Params, read_body
from server.edge.http.context import Edge
from server.edge.http.native import error_response
from server.edge.http.translate import Ask, translate

UPLOAD_BYTES = LIMITS.max_file_bytes + (256 << 10)  # the file and the form around it
FIELD_BYTES = 64 << 10  # one form field that is not the file
_ID = re.compile(r"[0-9A-F]{32}")
_TAKEN = "Document not found: its result was downloaded already"
STATUS_WAIT_S = 1.0  # a DeepL status request for an unfinished job waits this long for it to finish


class FormError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Upload:
    """A multipart upload: the file's name and bytes, and the other fields as text."""

    def __init__(self, filename: str, data: bytes, fields: dict[str, str]):
        self.filename, self.data, self.fields = filename, data, fields

    def get(self, name: str) -> Optional[str]:
        value = self.fields.get(name)
        return value.strip() if isinstance(value, str) else value


async def read_upload(request: Request, edge: Edge, field: str = "file") -> Upload:
    """The body within the upload limits (413 / 408 as every body), parsed as multipart/form-data."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        body = await read_body(request, UPLOAD_BYTES, edge.body_timeout_s)
    except BodyError as e:
        raise FormError(e.status, e.message if e.status != 413 else
                        f"File too large: {e.message} (files up to {LIMITS.max_file_bytes} bytes)") from None
    if kind != "multipart/form-data":
        raise FormError(400, f"Parameter '{field}' not specified: send the file as multipart/form-data "
                             f"(got {kind or 'no content type'!r})")
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=64, max_part_size=FIELD_BYTES)
    except Exception as e:  # noqa: BLE001 (python-multipart and Starlette raise several kinds on a bad body)
        raise FormError(400, f"the body is not a valid multipart form ({getattr(e, 'detail', None) or e})") from None
    try:
        fields, upload = {}, None
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                if name == field:
                    upload = value
            elif name in fields:
                raise FormError(400, f"Parameter '{name[:40]}' must be given once")
            else:
                fields[name] = value
        if upload is None:
            raise FormError(400, f"Parameter '{field}' not specified: send the document as a file part")
        data = await upload.read()
        return Upload(upload.filename or "", data, fields)
    finally:
        await form.close()


class DocumentsApi:
    def __init__(self, edge: Edge, spool: Optional[str] = None):
        self.edge = edge
        self.jobs = Jobs(self._translate, self._detect, spool=spool)

    def routes(self) -> list[Route]:
        return [Route("/v2/document", self.deepl_upload, methods=["POST"]),
                Route("/v2/document/{ident}", self.deepl_status, methods=["GET", "POST"]),
                Route("/v2/document/{ident}/result", self.deepl_result, methods=["GET", "POST"]),
                Route("/translate_file", self.libre_upload, methods=["POST"]),
                Route("/download_file/{name:path}", self.libre_download, methods=["GET"]),
                Route("/v1/files", self.native_upload, methods=["POST"]),
                Route("/v1/files/{ident}", self.native_status, methods=["GET", "DELETE"]),
                Route("/v1/files/{ident}/content", self.native_content, methods=["GET"])]

    # -- what every API shares --------------------------------------------------------------
    async def _translate(self, job: Job, texts: list[str]) -> list[str]:
        ask = Ask(texts=texts, source=job.source, target=job.target, html=job.document.markup,
                  split=pb.SPLIT_SENTENCES_ON, glossary_id=job.glossary_id, background=True)
        return [r.text for r in await translate(self.edge, ask, job.caller)]

    async def _detect(self, job: Job, sample: str) -> str:
        """The served source language the document is in; refused when it looks like the target already."""
        try:
            return await self.edge.admission.document_source(job.target, sample, "name its source language")
        except ServiceError as e:
            raise JobFailed(str(e)) from None

    def _check_languages(self, source: str, target: str, names: tuple[str, str]) -> None:
        if not target:
            raise BadParam(f"Parameter '{names[1]}' not specified.")
        if target not in self.edge.admission.targets():
            raise BadParam(f"Value for '{names[1]}' not supported: {target!r} is not a target language of this "
                           "server")
        if source and source not in self.edge.admission.sources(target):
            raise BadParam(f"Value for '{names[0]}' not supported: {source!r} is not translated into {target!r} "
                           "by this server")

    def _owned(self, ident: str, owner: Optional[str], key: Optional[str] = None) -> Optional[Job]:
        job = self.jobs.get(ident.upper()) if _ID.fullmatch(ident.upper()) else None
        if job is None or (key is not None and key.upper() != job.key) or (owner is not None and job.owner != owner):
            return None
        return job

    def _result(self, job: Job, gone: Response) -> Response:
        """The job's file, which is then deleted; `gone` when a download elsewhere took it first."""
        data = self.jobs.take(job)
        return gone if data is None else self._file(job, data)

    @staticmethod
    def _file(job: Job, data: bytes) -> Response:
        name = job.output_name()
        ascii_name = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120] or "document"
        disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name[:200])}"
        return Response(data, media_type=job.format.media_type, headers={"Content-Disposition": disposition})

    # -- DeepL -------------------------------------------------------------------------------
    async def deepl_upload(self, request: Request) -> Response:
        count = lambda r: self.edge.count(deepl.API, "document", r)  # noqa: E731
        key = _deepl_key(request)
        try:
            upload = await read_upload(request, self.edge)
        except FormError as e:
            return count(deepl.error(e.status, e.message))
        key = key or upload.get("auth_key")
        owner = self.edge.key_id(key)
        if owner is None:
            return count(deepl.error(403, "Authorization failure: " + ("invalid API key" if key else
                                                                        "missing API key")))
        target = deepl.from_deepl(upload.get("target_lang") or "")
        source = deepl.from_deepl(upload.get("source_lang") or "")
        filename = upload.get("filename") or upload.filename
        try:
            self._check_languages(source, target, ("source_lang", "target_lang"))
            formality = (upload.get("formality") or "default").lower()
            if formality not in deepl.FORMALITY:
                raise BadParam(f"Value for 'formality' not supported: {formality!r}")
            if formality in ("more", "less"):
                raise BadParam(f"Target language {target.upper()!r} does not support formality: send "
                               "formality=default, prefer_more or prefer_less")
            glossary_id = upload.get("glossary_id") or ""
            if glossary_id and not source:
                raise BadParam("Value for 'source_lang' is required when using a glossary")
            wanted = (upload.get("output_format") or "").lower().lstrip(".")
            if wanted and "." + wanted not in _extensions(filename):
                raise BadParam(f"Value for 'output_format' not supported: {wanted!r} (a document comes back in "
                               "its own format)")
            job = await self.jobs.submit(filename, upload.data, source, target,
                                         self.edge.caller(request, key), owner, glossary_id)
        except BadParam as e:
            return count(deepl.error(400, str(e)))
        except FileError as e:
            return count(deepl.error(413 if str(e).startswith("File too large") else 400, str(e)))
        except Full as e:
            return count(deepl.error(429, f"Too many requests: {e}", {"Retry-After": "5"}))
        return count(JSONResponse({"document_id": job.id, "document_key": job.key}))

    async def _deepl_job(self, request: Request) -> tuple[Optional[Job], Optional[Response]]:
        """(the job the request names, None) or (None, the refusal)."""
        try:
            params = await Params.of(request, self.edge.max_body_bytes, self.edge.body_timeout_s)
            document_key = params.text("document_key")
            key = _deepl_key(request) or params.text("auth_key")
        except (BodyError, BadParam) as e:
            return None, deepl.error(getattr(e, "status", 400), str(e))
        owner = self.edge.key_id(key)
        if owner is None:
            return None, deepl.error(403, "Authorization failure: " + ("invalid API key" if key else "missing API key"))
        if not document_key:
            return None, deepl.error(400, "Parameter 'document_key' not specified.")
        job = self._owned(request.path_params["ident"], owner, document_key)
        if job is None:
            return None, deepl.error(404, "Document not found (unknown id or key, expired, or downloaded)")
        return job, None

    async def deepl_status(self, request: Request) -> Response:
        job, refused = await self._deepl_job(request)
        if job is None:
            return self.edge.count(deepl.API, "document_status", refused)
        # DeepL's clients poll every 5 s: a small document is done at the first
        job = await self.jobs.wait(job, STATUS_WAIT_S)
        body = {"document_id": job.id, "status": job.status}
        if job.status in ("queued", "translating"):
            body["seconds_remaining"] = job.seconds_remaining(self.jobs.clock())
        if job.status == "done":
            body["billed_characters"] = job.billed
        if job.status == "error":
            body["error_message"] = job.error
        return self.edge.count(deepl.API, "document_status", JSONResponse(body))

    async def deepl_result(self, request: Request) -> Response:
        job, refused = await self._deepl_job(request)
        if job is None:
            response = refused
        elif job.status == "error":
            response = deepl.error(400, f"Document translation failed: {job.error}")
        elif job.status != "done":
            response = deepl.error(503, f"Document not ready: {job.status}", {"Retry-After": "1"})
        else:
            response = self._result(job, deepl.error(404, _TAKEN))
        return self.edge.count(deepl.API, "document_result", response)

    # -- LibreTranslate ----------------------------------------------------------------------
    async def libre_upload(self, request: Request) -> Response:
        count = lambda r: self.edge.count(libre.API, "translate_file", r)  # noqa: E731
        try:
            upload = await read_upload(request, self.edge)
        except FormError as e:
            return count(libre.error(e.status, e.message))
        key = upload.get("api_key") or None
        owner = self.edge.key_id(key)
        if owner is None:
            return count(libre.error(403, "Invalid API key"))
        source, target = (upload.get("source") or "").lower(), (upload.get("target") or "").lower()
        try:
            if not source:
                raise BadParam("Invalid request: missing source parameter")
            if not target:
                raise BadParam("Invalid request: missing target parameter")
            source = "" if source == "auto" else source
            self._check_languages(source, target, ("source", "target"))
            job = await self.jobs.submit(upload.filename, upload.data, source, target,
                                         self.edge.caller(request, key), owner)
        except (BadParam, FileError) as e:
            too_large = str(e).startswith("File too large")
            return count(libre.error(413 if too_large else 400, str(e)))
        except Full as e:
            return count(libre.error(429, str(e), {"Retry-After": "5"}))
        await job.ended.wait()
        if job.status != "done":
            return count(libre.error(400, job.error))
        url = f"{str(request.base_url).rstrip('/')}/download_file/{job.id}.{quote(job.output_name())}"
        return count(JSONResponse({"translatedFileUrl": url}))

    async def libre_download(self, request: Request) -> Response:
        count = lambda r: self.edge.count(libre.API, "download_file", r)  # noqa: E731
        ident = request.path_params["name"].split(".", 1)[0]
        job = self._owned(ident, None)
        if job is None or job.status != "done":
            return count(libre.error(404, "Invalid filename: no such translated file (expired or downloaded)"))
        return count(self._result(job, libre.error(404, _TAKEN)))

    # -- native ------------------------------------------------------------------------------
    def _native_owner(self, request: Request) -> tuple[Optional[str], Optional[Response]]:
        caller = self.edge.caller(request)
        owner = self.edge.key_id(caller.key)
        if owner is None:
            return None, error_response(401, "UNAUTHENTICATED", "invalid API key" if caller.key else
                                        "missing API key: send 'Authorization: Bearer KEY'")
        return owner, None

    def _native_job(self, job: Job) -> dict:
        body = {"id": job.id, "filename": job.filename, "status": job.status, "sourceLanguage": job.source,
                "targetLanguage": job.target, "segmentsDone": job.done, "segmentsTotal": job.total,
                "billedCharacters": job.billed, "secondsRemaining": job.seconds_remaining(self.jobs.clock())}
        if job.error:
            body["error"] = job.error
        return body

    async def native_upload(self, request: Request) -> Response:
        count = lambda r: self.edge.count("native", "TranslateFile", r)  # noqa: E731
        try:
            upload = await read_upload(request, self.edge)
        except FormError as e:
            return count(error_response(e.status, "INVALID_ARGUMENT" if e.status != 413 else "RESOURCE_EXHAUSTED",
                                        e.message))
        owner, refused = self._native_owner(request)
        if refused is not None:
            return count(refused)
        targets = self.edge.admission.targets()
        target = (upload.get("target_language") or (targets[0] if len(targets) == 1 else "")).lower()
        source = (upload.get("source_language") or "").lower()
        try:
            self._check_languages(source, target, ("source_language", "target_language"))
            job = await self.jobs.submit(upload.filename, upload.data, source, target, self.edge.caller(request),
                                         owner)
        except (BadParam, FileError) as e:
            too_large = str(e).startswith("File too large")
            return count(error_response(413 if too_large else 400, "RESOURCE_EXHAUSTED" if too_large
                                        else "INVALID_ARGUMENT", str(e)))
        except Full as e:
            return count(error_response(429, "RESOURCE_EXHAUSTED", str(e), headers={"Retry-After": "5"}))
        return count(JSONResponse(self._native_job(job)))

    def _native_job_of(self, request: Request) -> tuple[Optional[Job], Optional[Response]]:
        """(the caller's job named in the path, None) or (None, the refusal: no key, or no such job)."""
        owner, refused = self._native_owner(request)
        if refused is not None:
            return None, refused
        job = self._owned(request.path_params["ident"], owner)
        if job is None:
            return None, error_response(404, "NOT_FOUND", "no such file job (expired, downloaded or never made)")
        return job, None

    async def native_status(self, request: Request) -> Response:
        count = lambda r: self.edge.count("native", "GetFile", r)  # noqa: E731
        job, refused = self._native_job_of(request)
        if refused is not None:
            return count(refused)
        if request.method == "DELETE":
            self.jobs.drop(job)
            return count(JSONResponse({}))
        return count(JSONResponse(self._native_job(job)))

    async def native_content(self, request: Request) -> Response:
        count = lambda r: self.edge.count("native", "GetFileContent", r)  # noqa: E731
        job, refused = self._native_job_of(request)
        if refused is not None:
            return count(refused)
        if job.status != "done":
            message = job.error if job.status == "error" else f"the file is not translated yet ({job.status})"
            return count(error_response(400, "FAILED_PRECONDITION", message))
        return count(self._result(job, error_response(404, "NOT_FOUND", _TAKEN)))


def _deepl_key(request: Request) -> Optional[str]:
    scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() in ("deepl-auth-key", "bearer") and value.strip() else None


def _extensions(filename: str) -> tuple[str, ...]:
    from server.files import format_of
    try:
        return format_of(filename).extensions
    except FileError:
        return ()
