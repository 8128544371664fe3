"""An HTTP voice server on an exported voice (Starlette on uvicorn), with a page to type and listen.

Reads an export folder (`--voice runs/{name}/export`, pipeline/voice.py); writes nothing. Binds
127.0.0.1 unless `--host` says otherwise.

  GET  /                      one page: a text box, speaker and pace controls, a play button, an audio player
  GET  /health                {"status": "ok"}
  GET  /voices                {"speakers": [...], "languages": [...], "sample_rate": 22050}
  POST /synthesize            JSON {"text", "speaker"?, "language"?, "pace"?, "pitch_shift"?, "ssml"?}
                              -> audio/wav (16-bit mono); at most MAX_WAV_SECONDS of audio, and
                              a sentence at most voice.MAX_SENTENCE_SECONDS, pauses at most MAX_PAUSE_SECONDS
                              in all, streamed or not (413, before the audio is made)
  POST /synthesize?stream=true  -> chunked audio/L16;rate=SR;channels=1 (16-bit big-endian PCM,
                              RFC 2586), one chunk per sentence as soon as it is ready, the first
                              made before the answer starts (its failure: the 4xx/5xx); a later
                              sentence the front end cannot say ends it without the final chunk

A sentence that would clip has its peaks limited to 0.95 (pipeline/voice.py), the same in a wav answer
and in a stream.

Every error is a JSON {"error": "<one line>"} with a 4xx/5xx status: 400 bad JSON, field or markup, or a
query parameter other than stream (the fields go in the body),
403 another site's Origin (`--allow-origin URL`: a reverse proxy's public address may call it too,
and its host name is answered to), or a Host it does not answer to: bound to a loopback address, one
other than localhost, 127.0.0.1, [::1] or the address itself; elsewhere, a name other than those and the
--host name (an IP address is answered to); `--allow-host NAME` adds a name (DNS rebinding), 415 a POST body not sent as application/json, 404/405, 408 a body
not sent within `--client-timeout` seconds, 413 a body over MAX_BODY bytes, 503 when the queue is full (`--workers` model calls at a time, `--queue` more waiting); a client
that hangs up gives its place back at the end of the sentence being made. A place is held until the
answer is sent, not only made: a stream's until its end, a whole wav's (sent WAV_CHUNK bytes at a
time) until the client has taken all but its last ~64 kB and what its socket's send buffer holds. A connection
that has not sent a whole request head within `--client-timeout` is closed; an idle keep-alive one after
KEEP_ALIVE seconds (uvicorn's timeout_keep_alive); at most CONNECTIONS connections at once. One
whose client takes none of an answer for `--client-timeout` seconds while the answer waits on it is
reset, as is one that takes under MIN_TAKE_RATE bytes a second of it (a trickle would keep its place
for ever), and the answer gives its place back (a slow reader, a player at real time, keeps it).

    python -m pipeline.serve --voice runs/demo/export [--host 127.0.0.1] [--port 8050] [--allow-origin URL]
    curl -s localhost:8050/synthesize -H 'Content-Type: application/json' -d '{"text": "Hello there."}' -o hello.wav
"""
import argparse
import asyncio
import contextvars
import fcntl
import functools
import ipaddress
import json
import logging
import re
import signal
import socket
import struct
import sys
import termios
import traceback
import urllib.parse

import anyio
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from pipeline.errors import PipelineError, cli, unique_pairs
from pipeline.voice import TooLong, Voice, VoiceFault
from pipeline.wavfile import to_pcm, wav_bytes

MAX_BODY = 100_000           # bytes of a request body
MAX_WAV_SECONDS = 600.0      # audio of one non-streamed answer (longer: ?stream=true)
MAX_PAUSE_SECONDS = 600.0    # pauses (<break>) of one request in all, streamed or not: a stream's silence is cheap
WAV_CHUNK = 65_536           # bytes of a whole answer handed to uvicorn at a time (WavAnswer)
MIN_TAKE_RATE = 4096         # bytes a second a client must take of an answer waiting on it (a tenth of real time)
CLIENT_TIMEOUT = 10.0        # seconds to send a request head, then its body; to take any of an answer (--client-timeout)
KEEP_ALIVE = 5               # seconds an idle keep-alive connection stays open
CONNECTIONS = 256            # uvicorn's limit_concurrency (beyond: its own plain 503)
WATCH_SECONDS = 0.5          # how often a request waiting for a place to build its answer checks its client is there
MAX_WORKERS = 64             # --workers at most (model calls at a time, each a thread and its memory)
MAX_QUEUE = 1000             # --queue at most (no more than CONNECTIONS requests are open at once anyway)
FIELDS = ("text", "speaker", "language", "pace", "pitch_shift", "ssml")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")   # the Host names a server on a loopback address answers


class ClientError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def error(status, message):
    """A JSON {"error": one line} answer; characters UTF-8 cannot encode (lone surrogates) as escapes."""
    line = " ".join(str(message).split())[:500].encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": line}, status_code=status)


def host_name(host):
    """A Host header's name, lower case, without its port: "localhost:8050" -> "localhost", "[::1]:80" -> "[::1]"."""
    host = host.strip().lower()
    if host.startswith("["):   # "[::1]evil.example" is no address with a port: kept whole, so no name it allows
        end = host.find("]") + 1
        return host[:end] if end and re.fullmatch(r"(:\d*)?", host[end:]) else host
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).removesuffix(".")   # tts.lan. is tts.lan


_ORIGIN = re.compile(r"(https?)://([^/:\[\]@?#\s]+|\[[0-9a-f:.]+\])(?::(\d{1,5}))?/?", re.IGNORECASE)
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")  # tts_server too


def _origin_host(host):
    """An origin's host as browsers send it (lower case, IDNA's ASCII form), or None if it is not one."""
    if host.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            return None
    try:
        host = host.lower().encode("idna").decode("ascii")
    except UnicodeError:
        return None
    return host if _HOST.fullmatch(host) else None


def allowed_origin(value):
    """An `--allow-origin` value as a browser's Origin header gives it ("https://tts.example.com": lower case,
    IDNA's ASCII host, no trailing slash or default port), or a PipelineError naming it: http or https,
    a host name or address, an optional port, nothing else."""
    match = _ORIGIN.fullmatch(value.strip())
    host = _origin_host(match[2]) if match else None
    port = int(match[3]) if match and match[3] else None
    if host is None or (port is not None and not 0 < port < 65536):
        raise PipelineError(f"--allow-origin {value!r}: an origin is http:// or https://, a host and an optional "
                            f"port, e.g. https://tts.example.com (the address a reverse proxy serves the page at)")
    scheme = match[1].lower()
    return f"{scheme}://{host}" + ("" if port in (None, {"http": 80, "https": 443}[scheme]) else f":{port}")


class Guard:
    """ASGI middleware against other sites' pages (cross-origin requests, DNS rebinding): 403 for a
    Host the server does not answer to (`hosts`, host_names's (names, addresses); None: any), and for
    an Origin that is neither the server's own (http:// or https:// and the Host) nor one of `origins`
    (allowed_origin's: a reverse proxy's public address, whose host name then also joins the names,
    for a proxy that passes the browser's Host on)."""

    def __init__(self, app, hosts=None, origins=()):
        self.app, self.origins = app, frozenset(origins)
        names, self.addresses = (None, False) if hosts is None else hosts
        self.names = None if names is None else {n.lower() for n in names} | {
            host_name(urllib.parse.urlsplit(o).netloc) for o in self.origins}

    def answers(self, host):
        name = host_name(host)
        return self.names is None or name in self.names or (self.addresses and is_address(name))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            host, origin = headers.get("host"), headers.get("origin")
            own = () if host is None else (f"http://{host.strip().lower()}", f"https://{host.strip().lower()}")
            refused = None
            if host is not None and not self.answers(host):
                refused = (f"Host {host!r}: a server on a network address answers to IP addresses and to "
                           f"{', '.join(sorted(self.names)) or 'no name'}; start it with --allow-host NAME to "
                           "answer to another (a page of another site can point its own name at this address)"
                           if self.addresses else f"Host {host!r}: a server on a loopback address answers only "
                           f"to {', '.join(sorted(self.names))}")
            elif origin is not None and origin.strip().lower() not in (*own, *self.origins):
                refused = f"Origin {origin!r}: only this server's own page may call it"
            if refused:
                await error(403, refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_address(name):
    """Whether a Host's name (host_name's) is an IP address: "192.168.1.5", "[fe80::1]"."""
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
    except ValueError:
        return False
    return True


class Gate:
    """A bounded queue in front of `workers` model calls: admit() refuses (503) beyond workers + queue
    requests admitted and not given back, waiting, being made or being sent: a stream until it ends
    (PcmStream), a whole wav until its last WAV_CHUNK is handed to uvicorn (WavAnswer). A slow reader's
    wav (up to 53 MB) is held inside that count, workers + queue of them at most, not CONNECTIONS.
    At most `workers` whole (non-streamed) answers are built at once (`answers`, first come first
    served): each holds up to MAX_WAV_SECONDS of audio (53 MB), so the others wait holding only their
    request, not 34 answers at once (2.8 GB at the defaults; CONNECTIONS of them, 14 GB). A stream
    holds one sentence at a time and takes its turns at the model calls alone."""

    def __init__(self, workers, queue):
        self.limiter, self.capacity, self.admitted = anyio.CapacityLimiter(workers), workers + queue, 0
        self.answers = anyio.Semaphore(workers)

    def admit(self):
        if self.admitted >= self.capacity:
            raise ClientError(503, f"busy: {self.admitted} requests in progress or queued; retry later")
        self.admitted += 1
        released = False

        def release():
            nonlocal released
            if not released:
                released, self.admitted = True, self.admitted - 1
        return release

    async def run(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def take_answer(self, request):
        """Wait for a place to build a whole answer (`answers`, first come first served); ClientDisconnect
        when the client hangs up meanwhile, its admission then given back by the caller at once rather
        than after the answers ahead of it."""
        taken = False
        async with anyio.create_task_group() as group:
            async def watch():
                while not await request.is_disconnected():
                    await anyio.sleep(WATCH_SECONDS)
                group.cancel_scope.cancel()
            group.start_soon(watch)
            await self.answers.acquire()
            taken = True
            group.cancel_scope.cancel()
        if not taken:
            raise ClientDisconnect()


async def read_body(request, timeout):
    """The request body, at most MAX_BODY bytes, sent within `timeout` seconds."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        raise ClientError(413 if length.isdigit() else 400, f"body over {MAX_BODY} bytes" if length.isdigit()
                          else "bad Content-Length")
    body = bytearray()
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY:
                    raise ClientError(413, f"body over {MAX_BODY} bytes")
    except TimeoutError:
        raise ClientError(408, f"the body was not sent within {timeout:g} s") from None
    return bytes(body)


def _twice(key):
    raise ValueError(f"the field {key!r} is given twice")


def parse_fields(body):
    """The JSON body's fields (only FIELDS; text a non-empty string) -> dict; ClientError 400 otherwise."""
    try:
        fields = json.loads(body.decode("utf-8"), object_pairs_hook=unique_pairs(_twice))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ClientError(400, f"the body is not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ClientError(400, 'the body must be a JSON object {"text": ...}')
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ClientError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; fields: {', '.join(FIELDS)}")
    if not isinstance(fields.get("text"), str) or not fields["text"].strip():
        raise ClientError(400, 'text: a non-empty string is required')
    for key in ("speaker", "language"):
        if fields.get(key) is not None and not isinstance(fields[key], str):
            raise ClientError(400, f"{key}: a string (GET /voices lists them)")
    if fields.get("ssml") is not None and not isinstance(fields["ssml"], bool):
        raise ClientError(400, "ssml: true or false")
    return {"source": fields["text"], "speaker": fields.get("speaker"), "language": fields.get("language"),
            "ssml": fields.get("ssml"), "pace": 1.0 if fields.get("pace") is None else fields["pace"],
            "pitch_shift": 0.0 if fields.get("pitch_shift") is None else fields["pitch_shift"]}


class StreamStopped(Exception):
    """A streamed answer stopped part way (a later sentence the front end cannot say): the connection
    closes without the final chunk, so the client sees the answer is incomplete."""


# set in the request's own task when PcmStream stops its answer on purpose: uvicorn then logs "ASGI callable
# returned without completing response." as an error of the server's, which cut_at_shutdown leaves out
_STOPPED_ON_PURPOSE = contextvars.ContextVar("stopped_on_purpose", default=False)
INCOMPLETE = "ASGI callable returned without completing response."


class PcmStream(StreamingResponse):
    """A streamed answer that gives its place in the queue back however it ends (done, or the client gone)."""

    def __init__(self, content, release, **kwargs):
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except StreamStopped:
            _STOPPED_ON_PURPOSE.set(True)   # said on its own line ("a stream stopped: ..."), and the client sees it
        except (ClientDisconnect, OSError):
            pass
        finally:
            self.release()


class WavAnswer(Response):
    """A whole (non-streamed) wav answer, sent WAV_CHUNK bytes at a time, that gives its place in the
    queue back however it ends (sent, the client gone, or cut off), as PcmStream does. uvicorn's send
    waits while its transport holds over 64 kB the client has not taken, so the place is held until
    the client has taken all but the last chunk and its socket's send buffer: one send of the whole
    body (Response) put all of it (up to 53 MB) in the transport's buffer at once and gave the place
    back, and a slow reader then held its answer in memory outside the queue's count."""
    media_type = "audio/wav"

    def __init__(self, body, release):
        super().__init__(body)   # Content-Length: the whole body's
        self.release = release

    async def __call__(self, scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            size = len(self.body)
            for start in range(0, max(size, 1), WAV_CHUNK):   # a client gone: uvicorn's send returns at once
                await send({"type": "http.response.body", "body": self.body[start:start + WAV_CHUNK],
                            "more_body": start + WAV_CHUNK < size})
        except (ClientDisconnect, OSError):
            pass
        finally:
            self.release()


def json_errors(handler):
    """Every failure of a handler as a JSON error: ClientError and PipelineError (bad text, markup,
    speaker) as 4xx, a VoiceFault (the voice gave NaN audio) as 500, anything else as 500 with its
    traceback on standard error."""
    @functools.wraps(handler)
    async def wrapper(request):
        try:
            return await handler(request)
        except ClientError as e:
            return error(e.status, e)
        except TooLong as e:   # refused before its audio was made
            return error(413, f"{e}: ask with ?stream=true" if e.whole else e)
        except VoiceFault as e:  # the voice's fault, not the request's
            print(f"error: {e}", file=sys.stderr, flush=True)
            return error(500, e)
        except PipelineError as e:
            return error(400, e)
        except ClientDisconnect:
            return error(400, "the client went away")
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return error(500, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return wrapper


def check_request(request):
    """A POST /synthesize's query and Content-Type, before its body is read -> whether it asks for a
    stream; ClientError (400, 415) naming what is wrong."""
    unknown = sorted(set(request.query_params) - {"stream"})
    if unknown:   # ?pace=3 was taken and ignored: a 200 at the default pace
        raise ClientError(400, f"unknown query parameter(s) {', '.join(map(repr, unknown))}: the query takes "
                               f"only stream; the fields ({', '.join(FIELDS)}) go in the JSON body")
    if len(request.query_params.getlist("stream")) > 1:
        raise ClientError(400, "stream: given twice")
    stream = request.query_params.get("stream", "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise ClientError(400, "stream: true or false")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":   # a page of another site can send text/plain without asking first
        raise ClientError(415, f"Content-Type {kind or '(none)'}: the body must be application/json "
                               "(curl: -H 'Content-Type: application/json')")
    return stream in ("true", "1")


async def whole_answer(gate, voice, fields, request):
    """A non-streamed answer's wav bytes, built in one of the gate's `answers` places (the text checked
    first: a 400 or 413 does not wait for the answers ahead)."""
    prepared = await gate.run(functools.partial(voice.prepare, **fields, lazy=False, max_seconds=MAX_WAV_SECONDS,
                                                   max_pause_seconds=MAX_PAUSE_SECONDS))
    await gate.take_answer(request)
    try:
        sentences, audio = voice.sentences_float(prepared), []
        while (chunk := await gate.run(next, sentences, None)) is not None:
            audio.append(chunk)
            if await request.is_disconnected():   # hung up: the next sentences would be for nobody
                raise ClientDisconnect()
        return wav_bytes(to_pcm(np.concatenate(audio), "the answer"), voice.sample_rate)
    finally:
        gate.answers.release()


def build_app(voice, workers=2, queue=32, client_timeout=CLIENT_TIMEOUT, hosts=None, origins=()):
    """The Starlette app of a loaded Voice, behind Guard(hosts, origins): the Host names it answers to
    (host_names's; None: any) and the other origins whose pages may call it."""
    gate = Gate(workers, queue)

    async def synthesize(request):
        streamed = check_request(request)
        fields = parse_fields(await read_body(request, client_timeout))
        release = gate.admit()
        try:
            if streamed:   # the first sentence before the answer starts: its failure is a 4xx/5xx, not a 200
                # each sentence's bound, and the pauses' (pipeline/voice.py): its speech is bounded by its text
                prepared = await gate.run(functools.partial(voice.prepare, **fields, lazy=True, max_seconds=None,
                                                            max_pause_seconds=MAX_PAUSE_SECONDS))
                sentences = voice.sentences_audio(prepared)   # int16, a sentence at a time
                first = await gate.run(next, sentences, None)

                async def chunks():
                    pcm = first
                    try:
                        while pcm is not None:
                            yield pcm.astype(">i2").tobytes()
                            pcm = await gate.run(next, sentences, None)
                    except PipelineError as e:
                        print(f"a stream stopped: {e}", file=sys.stderr, flush=True)
                        raise StreamStopped() from None
                media = f"audio/L16;rate={voice.sample_rate};channels=1"
                response = PcmStream(chunks(), release, media_type=media)
            else:
                response = WavAnswer(await whole_answer(gate, voice, fields, request), release)
            release = None   # the answer gives its place back once it is sent (or its client is gone)
            return response
        finally:
            if release is not None:
                release()

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def voices(request):
        return JSONResponse(voice.describe())

    async def page(request):
        return HTMLResponse(PAGE)

    async def http_error(request, exc):
        response = error(exc.status_code, exc.detail)
        response.headers.update(exc.headers or {})   # a 405's Allow (RFC 9110: it must say what the path takes)
        return response

    routes = [Route("/", page, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/voices", voices, methods=["GET"]),
              Route("/synthesize", json_errors(synthesize), methods=["POST"])]
    return Guard(Starlette(routes=routes, exception_handlers={HTTPException: http_error}), hosts, origins)


class Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has no request under way `timeout` s after it
    opened or after its last answer (uvicorn times out only idle keep-alive connections, so a client
    that sends half a request head and stalls would hold its socket for ever), and cutting one whose
    client takes none of its answer for `timeout` s while the answer waits on it (a stream would hold
    its place in the queue for ever, a whole wav its place, socket and memory)."""
    timeout = CLIENT_TIMEOUT

    def connection_made(self, transport):
        super().connection_made(transport)
        self._write_timer = None
        self._arm()

    def on_response_complete(self):
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc):
        for timer in (getattr(self, "_head_timer", None), getattr(self, "_write_timer", None)):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def pause_writing(self):   # the transport holds over 64 kB the client has not taken: send() waits
        super().pause_writing()
        self._watch_writes()

    def resume_writing(self):
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _arm(self):
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.timeout, self._stalled)

    def _stalled(self):
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self.transport.close()
        if idle and self.transport.get_write_buffer_size():   # close() waits for the client to take the rest
            self._watch_writes()

    def _watch_writes(self):
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.timeout, self._writes_stalled, unsent(self.transport))

    def _writes_stalled(self, before):
        self._write_timer, left = None, unsent(self.transport)
        took = before - left
        if took >= MIN_TAKE_RATE * self.timeout:   # a slow reader (a player at real time), not a stalled one
            self._write_timer = self.loop.call_later(self.timeout, self._writes_stalled, left)
            return
        # none, or a trickle (a byte every few seconds would hold its place in the queue for ever)
        what = "none of its answer" if took <= 0 else f"{took} bytes of its answer (under {MIN_TAKE_RATE} a second)"
        host, port = self.client or ("?", 0)
        print(f"cut off {host}:{port}: it took {what} in {self.timeout:g} s ({left} bytes unsent)",
              file=sys.stderr, flush=True)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:   # a reset: a FIN would wait in the kernel behind data nobody takes
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()   # connection_lost: the answer (PcmStream, WavAnswer) gives its place back


def unsent(transport):
    """Bytes written to a transport that its client has not taken: the transport's buffer and the
    kernel's send queue (SIOCOUTQ, Linux). The transport's buffer alone sat still for 26 s under a
    reader at real time: the kernel asks for more only once much of its send buffer (grown to 4 MB) is free."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    try:
        return size + struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4)))[0]
    except (AttributeError, OSError, ValueError):   # no socket, closed, or no SIOCOUTQ: the buffer alone
        return size


def host_names(host, allowed=()):
    """(names, addresses): the Host names a server bound to `host` answers to, and whether it also answers
    to any IP address. Always LOOPBACK_NAMES (a browser sends them only for a page of this machine's
    own) and `allowed`, the names of --allow-host. On a loopback address also `host`, and no other
    address: no other site's name can reach it but by DNS rebinding. Elsewhere (0.0.0.0, a network
    address or name) any IP address (a page can reach it by an address only from that address) and
    `host` if it is a name: a page of another site could point its own name at the server's address."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return (*LOOPBACK_NAMES, f"[{host.strip('[]')}]" if ":" in host else host, *allowed), False
    return (*LOOPBACK_NAMES, *(() if is_address(host.strip("[]")) else (host_label(host) or host,)), *allowed), True


def host_label(value):
    """A host name as a browser's Host header names it (lower case, IDNA's ASCII form, no trailing dot;
    `_` taken: a container's name), or None when it is not one."""
    try:
        name = value.strip().lower().removesuffix(".").encode("idna").decode("ascii")
    except UnicodeError:
        return None
    return name if _NAME.fullmatch(name) else None


def allowed_host(value):
    """An --allow-host value as a browser's Host header names it (host_label), or a PipelineError
    naming it."""
    name = host_label(value)
    if name is None or is_address(name):
        raise PipelineError(f"--allow-host {value!r}: a host name, e.g. tts.example.com, not an address or a port")
    return name


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Serve an exported voice over HTTP (and a page to try it).")
    parser.add_argument("--voice", required=True, help="the export folder (runs/{name}/export)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--workers", type=int, default=2, help=f"model calls at a time (1..{MAX_WORKERS}, default 2)")
    parser.add_argument("--queue", type=int, default=32,
                        help=f"requests waiting beyond those; more get 503 (0..{MAX_QUEUE}, default 32)")
    parser.add_argument("--client-timeout", type=float, default=CLIENT_TIMEOUT,
                        help=f"seconds a client has to send a request head, then its body, and over which it "
                             f"must take at least {MIN_TAKE_RATE} bytes a second of an answer that waits on it "
                             f"(default {CLIENT_TIMEOUT:g})")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                        help="another origin whose pages may call the server, e.g. https://tts.example.com: the "
                             "address a reverse proxy serves it at (repeatable)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="another name the server answers to as the Host of a request, e.g. tts-box.lan "
                             "(repeatable): on a network address it answers to its IP addresses, else only the "
                             "names given (DNS rebinding)")
    args = parser.parse_args(argv)
    origins = [allowed_origin(o) for o in args.allow_origin]
    names = [allowed_host(h) for h in args.allow_host]
    for option, value, low, high in (("--workers", args.workers, 1, MAX_WORKERS), ("--queue", args.queue, 0, MAX_QUEUE)):
        if not low <= value <= high:
            raise PipelineError(f"{option} {value}: must be in {low}..{high}")
    if not 0 < args.client_timeout < 3600:
        raise PipelineError(f"--client-timeout {args.client_timeout:g}: must be in (0, 3600) seconds")
    if not 1 <= args.port <= 65535:
        raise PipelineError(f"--port {args.port}: a port is 1..65535")
    sockets = listen(args.host, args.port)  # before the voice loads: a port in use is one line, at once
    voice = Voice(args.voice, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    app = build_app(voice, args.workers, args.queue, args.client_timeout, hosts=host_names(args.host, names),
                    origins=origins)
    protocol = type("Protocol", (Protocol,), {"timeout": args.client_timeout})
    print(f"voice {args.voice} loaded in {voice.load_seconds:.2f} s; serving http://{args.host}:{args.port}/",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, http=protocol, log_level="warning",
                            timeout_keep_alive=KEEP_ALIVE, limit_concurrency=CONNECTIONS, timeout_graceful_shutdown=5,
                            h11_max_incomplete_event_size=16_384,
                            use_colors=False)   # else it asks sys.stdout.isatty(): None when started with `>&-`
    logging.getLogger("uvicorn.error").addFilter(cut_at_shutdown)
    server = Server(config)
    server.run(sockets=sockets)   # SIGINT raised again after it stops: errors.cli's one line
    if server.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt   # started with SIGINT ignored (a script's `serve &`): raised again, it did nothing


class Server(uvicorn.Server):
    """uvicorn's server, remembering the signal that stopped it. uvicorn stops on SIGINT even when the
    process started with SIGINT ignored (a background job of a shell script), then raises it again into
    that ignored disposition: the server exited 0 without its "stopped (Ctrl-C)" line."""
    stopped_by = None

    def handle_exit(self, sig, frame):
        self.stopped_by = self.stopped_by or sig
        super().handle_exit(sig, frame)


def cut_at_shutdown(record):
    """uvicorn's log filter: an answer still being made or sent when the server stops (it cancels them
    after timeout_graceful_shutdown) is one line, not "Exception in ASGI application" and a traceback;
    a second Ctrl-C is no traceback either; a stream stopped on purpose is not called the server's error."""
    if record.getMessage() == INCOMPLETE and _STOPPED_ON_PURPOSE.get():
        return False
    if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
        print("stopping: an answer still being made or sent was cut off", file=sys.stderr, flush=True)
        return False
    text = record.getMessage().rstrip()  # a second Ctrl-C (force exit) cancels Starlette's lifespan task, which
    return not (text.startswith("Traceback") and text.endswith("CancelledError"))   # sends its traceback as text


def listen(host, port):
    """Sockets bound to host:port as uvicorn's server bound them through asyncio's create_server (one
    per address the host resolves to, SO_REUSEADDR, an IPv6 one IPv6-only), or PipelineError naming
    both: uvicorn found a port in use only after the voice had loaded and "serving" was printed, and
    exited with status 3 and its own log line."""
    sockets = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise PipelineError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e} (another server on "
                            "that port? give another --port)") from None
    return sockets


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Voice</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px sans-serif;max-width:42em;margin:2em auto;padding:0 1em}textarea{width:100%;height:8em}
label{margin-right:1em}#status{color:#555;min-height:1.5em}</style></head>
<body><h1>Voice</h1>
<textarea id="text" aria-label="text">Hello there. How are you today?</textarea>
<p><label>Speaker <select id="speaker"></select></label>
<label>Pace <input id="pace" type="range" min="0.5" max="2" step="0.05" value="1">
<output id="pace-value">1</output></label>
<label><input id="ssml" type="checkbox"> SSML</label></p>
<p><button id="play">Play</button></p>
<p id="status"></p>
<audio id="audio" controls></audio>
<script>
const $ = (id) => document.getElementById(id);
$("pace").oninput = () => { $("pace-value").textContent = $("pace").value; };
// an error answer's message: the server's JSON {"error"}, else (uvicorn's own plain-text 503 beyond its
// connection limit, a proxy's page) the status and the text as they are, never a JSON parse error
const failure = async (r) => {
  const text = await r.text();
  if ((r.headers.get("Content-Type") || "").toLowerCase().startsWith("application/json")) {
    try { return JSON.parse(text).error || text; } catch (e) { /* not JSON after all: the text below */ }
  }
  return (r.status + " " + (text.trim().slice(0, 300) || r.statusText)).trim();
};
fetch("voices").then(async (r) => {
  if (!r.ok) throw new Error(await failure(r));
  const v = await r.json();
  for (const name of (v.speakers.length ? v.speakers : [""])) {
    const o = document.createElement("option"); o.value = name; o.textContent = name || "(the voice)";
    $("speaker").appendChild(o);
  }
}).catch((e) => { $("status").textContent = "error: " + e.message; });
$("play").onclick = async () => {
  const body = {text: $("text").value, pace: parseFloat($("pace").value), ssml: $("ssml").checked};
  if ($("speaker").value) body.speaker = $("speaker").value;
  $("status").textContent = "speaking...";
  let audio;
  try {
    const r = await fetch("synthesize", {method: "POST", headers: {"Content-Type": "application/json"},
                                         body: JSON.stringify(body)});
    if (!r.ok) { $("status").textContent = "error: " + await failure(r); return; }
    audio = await r.blob();
  } catch (e) { $("status").textContent = "error: " + e.message; return; }   // the server unreachable
  $("audio").src = URL.createObjectURL(audio);
  $("audio").dataset.bytes = audio.size;
  $("status").textContent = "";
  $("audio").play().catch(() => {});
};
</script></body></html>
"""


if __name__ == "__main__":
    main()
