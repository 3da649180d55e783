"""``corpus-io explore``: the HTTP server (stdlib ``ThreadingHTTPServer``), read-only.

Routes (GET only; anything else is 404/405):

* ``/`` and ``/static/app.js|app.css``: the page (files from this package, picked from a fixed table);
* ``/api/info``: input, row count, decode runs, shards (what the first table needs);
* ``/api/dataset``: totals, per-shard balance, alphabet, vocabulary, decode summaries (computed once);
* ``/api/rows?page=&size=&sort=&desc=&<filters>``: one page of the table (size at most 1000);
* ``/api/hist?column=&bins=&<filters>``: a histogram of a numeric column;
* ``/api/row/<row_id>``: one utterance, with the ref/hyp diff when decode results are joined;
* ``/api/audio/<row_id>``: its stored audio bytes, with HTTP Range (206) so the player can seek (with
  ``++dump_audio_dir``: the row's dumped ``<key>.wav`` when the directory holds one, for this route and the
  pictures; the row says ``audio_dumped``);
* ``/api/waveform/<row_id>?width=`` and ``/api/spectrogram/<row_id>.png``: pictures of it.

Bad parameters are 400, an unknown row or path 404, an unsatisfiable range 416; a row whose shard is
missing or damaged answers with its message (and the audio route with 404 and that message), never a crash.
"""

from __future__ import annotations

import json
import math
import re
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from corpus_io.explore.media import Audio, MediaError, peaks, spectrogram_png
from corpus_io.explore.query import BadRequest, Explorer, int_param

STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/static/app.css": ("app.css", "text/css; charset=utf-8")}
_ROW_ROUTE = re.compile(r"/api/(row|audio|waveform|spectrogram)/(\d{1,15})(\.png)?")
MAX_WAVEFORM_WIDTH = 4000


class NotFound(LookupError):
    pass


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf (a 0-duration cps, an empty reference) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end)`` inclusive of a single ``bytes=`` range, None when it cannot be satisfied."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not m or (not m.group(1) and not m.group(2)) or size == 0:
        return None
    if not m.group(1):  # the last N bytes
        n = int(m.group(2))
        return (max(0, size - n), size - 1) if n else None
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


class Handler(BaseHTTPRequestHandler):
    server_version = "corpus-io-explore"
    explorer: Explorer  # set on the subclass made by make_server
    quiet = True

    def log_message(self, fmt: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(fmt, *args)

    # ----------------------------------------------------------------- plumbing

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200) -> None:
        body = json.dumps(_clean(obj), ensure_ascii=False, default=_json_default).encode("utf-8")
        self._send(status, body, "application/json; charset=utf-8", {"Cache-Control": "no-store"})

    def _error(self, status: int, message: str) -> None:
        self._json({"error": message, "status": status}, status)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the explorer is read-only: only GET and HEAD")

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        try:
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            self._route(url.path, params)
        except BadRequest as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
        except NotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except MediaError as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser moved on (a seek aborts the previous audio request)
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the server
            print(f"explore: {self.path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    # ----------------------------------------------------------------- routes

    def _route(self, path: str, params: dict[str, str]) -> None:
        ex = self.explorer
        if path in STATIC:
            name, ctype = STATIC[path]
            body = resources.files("corpus_io.explore").joinpath("static", name).read_bytes()
            self._send(200, body, ctype, {"Cache-Control": "no-cache"})
        elif path == "/api/info":
            self._json(ex.info())
        elif path == "/api/dataset":
            self._json(ex.dataset())
        elif path == "/api/rows":
            self._json(ex.page(params))
        elif path == "/api/hist":
            self._json(ex.histogram(params))
        elif m := _ROW_ROUTE.fullmatch(path):
            what, row_id, ext = m.group(1), int(m.group(2)), m.group(3)
            if (what == "spectrogram") != bool(ext):
                raise NotFound(f"no such path: {path}")
            row = ex.row(row_id)
            if row is None:
                raise NotFound(f"row {row_id} is not in the catalog ({ex.size()} rows)")
            getattr(self, f"_{what}")(row, params)
        else:
            raise NotFound(f"no such path: {path}")

    def _row(self, row: dict, params: dict) -> None:
        try:
            audio = self._media(row)
            row["audio_bytes"], row["content_type"], row["audio_dumped"] = audio.size, audio.content_type, \
                audio.dumped
        except MediaError as exc:
            row["audio_error"] = str(exc)
        self._json(row)

    def _media(self, row: dict) -> Audio:
        return Audio(self.explorer.catalog, row, dump_dir=self.explorer.dump_audio_dir)

    def _audio(self, row: dict, params: dict) -> None:
        audio = self._media(row)
        headers = {"Accept-Ranges": "bytes", "Cache-Control": "no-cache"}
        requested = self.headers.get("Range")
        if not requested:
            self._send(200, audio.read(), audio.content_type, headers)
            return
        span = parse_range(requested, audio.size)
        if span is None:
            self._send(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, b"", audio.content_type,
                       {**headers, "Content-Range": f"bytes */{audio.size}"})
            return
        start, end = span
        self._send(HTTPStatus.PARTIAL_CONTENT, audio.read(start, end - start + 1), audio.content_type,
                   {**headers, "Content-Range": f"bytes {start}-{end}/{audio.size}"})

    def _waveform(self, row: dict, params: dict) -> None:
        width = int_param(params, "width", 800, 1, MAX_WAVEFORM_WIDTH)
        wave, rate = self._media(row).samples()
        self._json({"sample_rate": rate, "num_samples": len(wave), "peaks": peaks(wave, width)})

    def _spectrogram(self, row: dict, params: dict) -> None:
        wave, rate = self._media(row).samples()
        self._send(200, spectrogram_png(wave, rate), "image/png")


def make_server(explorer: Explorer | None, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The server listening on ``host``:``port`` (0: a free port); ``explorer`` None: set it on
    ``server.RequestHandlerClass.explorer`` before serving. An address it cannot listen on (a port in use, a host
    that is not this machine's, a port that needs root) is a ConfigError saying which key picks another."""
    import errno
    import socket

    from corpus_io.errors import ConfigError

    handler = type("ExploreHandler", (Handler,), {"explorer": explorer})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use (another explore, or another program, listens on "
                              f"{where}), so explore cannot serve there. Pick another port with ++port=N, or "
                              f"++port=0 for any free one (the address is printed).") from None
        if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):  # gaierror: a name of no address
            raise ConfigError(f"cannot listen on {where}: {host} is not an address of this machine "
                              f"({exc.strerror or exc}). Use ++host=127.0.0.1 (this machine only) or ++host=0.0.0.0 "
                              f"(every address of this machine).") from None
        if exc.errno == errno.EACCES:
            raise ConfigError(f"cannot listen on {where}: ports below 1024 need root. Pick a port above 1023 with "
                              f"++port=N, or ++port=0 for any free one.") from None
        raise
    server.daemon_threads = True
    return server


def explore(cfg: Any) -> None:
    """``corpus-io explore`` for a validated :class:`corpus_io.config.ExploreConfig`."""
    import os

    from corpus_io.errors import ConfigError
    from corpus_io.explore.catalog import build
    from corpus_io.storage.files import refuse_remote_output

    refuse_remote_output(cfg.cache_dir, "++cache_dir", "explore")
    if cfg.dump_audio_dir and not os.path.isdir(cfg.dump_audio_dir):
        raise ConfigError(f"dump_audio_dir={cfg.dump_audio_dir} is not a directory on this machine; give the "
                          f"directory that bench-loader ++dump_audio_dir=DIR wrote (its <key>.wav files).")
    # listen first: an address it cannot use fails before minutes of catalog building (requests wait in the backlog)
    server = make_server(None, cfg.host, cfg.port)
    try:
        storage_options = dict(cfg.storage_options or {}) or None
        catalog = build(cfg.input, cache_dir=cfg.cache_dir, storage_options=storage_options,
                        decode_dirs=[d for d in (cfg.decode_dir, cfg.compare_dir) if d], scores=cfg.scores)
        explorer = Explorer(catalog, token_list=cfg.token_list, dump_audio_dir=cfg.dump_audio_dir)
        server.RequestHandlerClass.explorer = explorer
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        print(f"corpus-io explore: {explorer.size()} utterances of {cfg.input} (catalog: {catalog.cache_dir})",
              flush=True)
        if host not in ("127.0.0.1", "::1", "localhost"):
            print(f"warning: listening on {host}: anyone who can reach this address can read the corpus "
                  f"(no authentication).", file=sys.stderr, flush=True)
        print(f"corpus-io explore: open http://{shown}:{port}/ (Ctrl-C to stop)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
