"""`python -m service` (or `mt-server`): the translation server under uvicorn, one worker process."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import uvicorn

from service.api import RequestIdFilter, create_app
from service.errors import ModelFolderError
from service.metrics import Metrics
from service.settings import Settings
from service.translator import load_translators


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level)
    metrics = Metrics()
    try:  # load and check every model folder before listening: a broken folder stops the start here
        translators = load_translators(settings, metrics)
    except ModelFolderError as error:
        logging.getLogger("service").error("cannot start: %s", error)
        return 1
    app = create_app(settings, translators, metrics)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        workers=1,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.request_timeout_seconds) + 5,
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the handler that was
    # there before it: make that one a no-op, so a requested shutdown that went well exits with status 0
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: None)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
