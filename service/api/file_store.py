"""Translated files waiting for their download (`translatedFileUrl`): one folder, each file under a random token
beside a small JSON record of its name, media type and expiry; a file expires after `seconds`, and past `capacity`
bytes the oldest go first. Every put and get sweeps what has expired, so the store cleans itself; replicas that
share the folder serve each other's downloads."""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from service.errors import InferenceError, TooLarge

log = logging.getLogger(__name__)
TOKEN_BYTES = 16  # 128 random bits: a download URL cannot be guessed


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    filename: str
    media_type: str


class FileStore:
    def __init__(self, folder: Path | None, seconds: float, capacity: int) -> None:
        self.folder = folder or Path(tempfile.gettempdir()) / f"mt-translated-files-{os.getuid()}"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.seconds, self.capacity = seconds, capacity

    def put(self, data: bytes, filename: str, media_type: str) -> str:
        """Keeps `data` for download; its token. TooLarge for a file over the whole store's capacity."""
        if len(data) > self.capacity:
            raise TooLarge(
                f"the translated file is {len(data)} bytes, over what the download store keeps "
                f"({self.capacity}, MT_FILE_STORE_BYTES): ask for it in the answer itself (response=file)"
            )
        self.sweep(room=len(data))
        token = secrets.token_urlsafe(TOKEN_BYTES)
        record = {"filename": filename, "media_type": media_type, "expires": time.time() + self.seconds}
        try:
            _write_atomically(self._data(token), data)
            _write_atomically(self._record(token), json.dumps(record).encode("utf-8"))
        except OSError as error:
            self._delete(token)
            raise InferenceError(
                f"the download store cannot keep the translated file ({error.strerror}, MT_FILE_STORE_DIR="
                f"{self.folder}): ask for it in the answer itself (response=file)"
            ) from None
        return token

    def get(self, token: str) -> StoredFile | None:
        """The file under `token`, or None: unknown, expired or malformed tokens alike."""
        self.sweep()
        if not token.replace("-", "").replace("_", "").isalnum():
            return None
        try:
            record = json.loads(self._record(token).read_text(encoding="utf-8"))
            data = self._data(token).read_bytes()
        except (OSError, ValueError):
            return None
        if record["expires"] <= time.time():
            return None
        return StoredFile(data, record["filename"], record["media_type"])

    def sweep(self, room: int = 0) -> None:
        """Deletes expired files, then the oldest until `room` more bytes fit within the capacity."""
        now, kept = time.time(), []
        for record_path in self.folder.glob("*.json"):
            token = record_path.stem
            try:
                expires = json.loads(record_path.read_text(encoding="utf-8"))["expires"]
                size = self._data(token).stat().st_size
            except (OSError, ValueError, KeyError):
                expires, size = 0.0, 0  # half written by another replica, or damaged: gone with the expired
            if expires <= now:
                self._delete(token)
            else:
                kept.append((expires, token, size))
        for orphan in [*self.folder.glob("*.bin"), *self.folder.glob(".*.tmp")]:  # a put that did not finish
            if not self._record(orphan.stem).exists() and _age(orphan, now) > self.seconds:
                orphan.unlink(missing_ok=True)
        used = sum(size for _, _, size in kept)
        for _, token, size in sorted(kept):  # the soonest to expire is the oldest
            if used + room <= self.capacity:
                break
            self._delete(token)
            used -= size

    def _data(self, token: str) -> Path:
        return self.folder / f"{token}.bin"

    def _record(self, token: str) -> Path:
        return self.folder / f"{token}.json"

    def _delete(self, token: str) -> None:
        for path in (self._record(token), self._data(token)):
            path.unlink(missing_ok=True)


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _write_atomically(path: Path, data: bytes) -> None:
    """A reader sees the whole file or none of it."""
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    staged.write_bytes(data)
    os.replace(staged, path)
