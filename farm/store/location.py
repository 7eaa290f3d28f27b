"""Where a job's outputs live: a local folder or a ``pyarrow.fs`` URI (``s3://``, ``gs://``, ``hdfs://``...).

A fleet's workers and its driver do not share a disk; they share storage. Everything that writes a
results part or reads the dataset goes through a :class:`Location`, so a local path and a bucket are
used the same way. A part is complete or absent: on a local (or mounted) folder it is written under a
hidden temporary name, flushed and renamed; on an object store the object appears only when its
upload completes (an upload cut short by a crash leaves nothing). Readers skip hidden names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from farm.errors import InputError
from farm.fsutil import fsync_dir, temp_path

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(where: str | Path) -> bool:
    """A ``scheme://`` address (``file://`` included), not a plain path."""
    return isinstance(where, str) and bool(_URI.match(where))


@dataclass(frozen=True)
class Location:
    """A folder on some filesystem: ``fs`` and the folder's ``path`` in it; ``uri`` as the user wrote it."""

    fs: Any
    path: str
    uri: str

    @staticmethod
    def of(where: "str | Path | Location") -> "Location":
        if isinstance(where, Location):
            return where
        if not is_uri(where):
            path = str(Path(where).absolute())
            return Location(pafs.LocalFileSystem(), path, str(where))
        try:
            fs, path = pafs.FileSystem.from_uri(str(where))
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise InputError(f"not a storage location pyarrow can open: {str(exc).splitlines()[0]}",
                             field="out", value=str(where)) from None
        return Location(fs, path.rstrip("/"), str(where))

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def local_path(self) -> Path:
        """The folder as a Path (local locations only)."""
        if not self.local:
            raise ValueError(f"{self.uri} is not a local folder")
        return Path(self.path)

    def join(self, *parts: str) -> "Location":
        path = "/".join([self.path.rstrip("/"), *parts]) if self.path else "/".join(parts)
        uri = self.uri
        if is_uri(uri):  # keep the query (endpoint, region...) after the joined path
            base, _, query = uri.partition("?")
            uri = "/".join([base.rstrip("/"), *parts]) + (f"?{query}" if query else "")
        else:
            uri = str(Path(uri, *parts))
        return Location(self.fs, path, uri)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def parent(self) -> "Location":
        path = self.path.rstrip("/").rsplit("/", 1)[0]
        base, sep, query = self.uri.partition("?")
        uri = base.rstrip("/").rsplit("/", 1)[0] + (f"?{query}" if sep else "")
        return Location(self.fs, path, uri)

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    def files(self, suffix: str = "") -> list[str]:
        """Paths (in ``fs``) of the files under the folder, recursively, sorted; [] when there is none."""
        if not self.is_dir():
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix))

    def relative(self, path: str) -> str:
        return path[len(self.path.rstrip("/")) + 1:] if path.startswith(self.path) else path

    def read_text(self, name: str) -> str | None:
        """A file's text, or None when it does not exist."""
        path = f"{self.path}/{name}"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read().decode("utf-8")

    def write_text(self, name: str, text: str) -> None:
        """Replace a file whole (temporary name and rename locally; one upload on an object store)."""
        if self.local:
            from farm.fsutil import atomic_write_text

            atomic_write_text(Path(self.path) / name, text)
            return
        with self.fs.open_output_stream(f"{self.path}/{name}") as f:
            f.write(text.encode("utf-8"))

    def write_parquet(self, folder: str, name: str, table: pa.Table) -> str:
        """Write ``table`` as ``folder/name`` under this location, complete or not at all; returns its path."""
        if self.local:
            target = Path(self.path) / folder
            target.mkdir(parents=True, exist_ok=True)
            tmp = temp_path(target / name)
            try:
                pq.write_table(table, tmp, compression="zstd")
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, target / name)
            except BaseException as exc:
                try:  # a full disk: no half-written part beside the complete ones
                    os.unlink(tmp)
                except OSError:
                    pass
                if isinstance(exc, OSError) and not getattr(exc, "filename", None):
                    raise OSError(exc.errno, exc.strerror or str(exc), str(target / name)) from exc
                raise
            fsync_dir(target)
            return str(target / name)
        path = f"{self.path}/{folder}/{name}"
        self.fs.create_dir(f"{self.path}/{folder}", recursive=True)
        buf = pa.BufferOutputStream()  # the whole file first: the upload is the only step that can leave it half
        pq.write_table(table, buf, compression="zstd")
        with self.fs.open_output_stream(path) as out:
            out.write(buf.getvalue())
        return path

    def set_aside(self, path: str, label: str) -> str:
        """Rename the file at ``path`` (as ``files`` lists it) to ``_<name>.<label>-<epoch>`` beside it, never over
        another: no Parquet reader lists it any more (a ``.parquet`` glob misses the suffix; pyarrow, pandas and
        Spark skip names starting with ``_``), and nothing is deleted. -> the new path."""
        if self.local:
            from farm.fsutil import move_aside

            return str(move_aside(path, label, prefix="_"))
        import time

        head, _, name = path.rpartition("/")
        stamp, n = int(time.time()), 0
        target = f"{head}/_{name}.{label}-{stamp}"
        while self.fs.get_file_info(target).type != pafs.FileType.NotFound:
            n += 1
            target = f"{head}/_{name}.{label}-{stamp}-{n}"
        self.fs.move(path, target)
        return target

    def __str__(self) -> str:
        return self.uri
