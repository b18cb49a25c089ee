"""Rewriting a wheel: unchanged members are copied as raw bytes (no recompression).

zipfile can read a member's metadata but cannot copy its compressed bytes, so this
module parses the central directory itself and writes local records + a new central
directory. ZIP64 archives are refused (a vLLM wheel is far below 4 GiB / 65535 files).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from pathlib import Path

from vstack.errors import VstackError

_EOCD = struct.Struct("<4sHHHHIIH")
_CDH = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LFH = struct.Struct("<4sHHHHHIIIHH")
CD_SIG, LF_SIG, EOCD_SIG = b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06"


@dataclasses.dataclass
class Member:
    name: str
    offset: int  # of the local header in the source
    end: int  # end of its local record (header + data + descriptor) in the source
    central: bytes  # its raw central-directory record


def read_members(path: Path) -> tuple[list[Member], int]:
    """Members in archive order, and where the central directory starts."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        tail_len = min(size, 65536 + _EOCD.size)
        f.seek(size - tail_len)
        tail = f.read()
        at = tail.rfind(EOCD_SIG)
        if at < 0:
            raise VstackError(f"{path}: not a zip file (no end of central directory)")
        _, disk, _, n_disk, n, cd_size, cd_off, _ = _EOCD.unpack_from(tail, at)
        if 0xFFFF in (n, n_disk) or 0xFFFFFFFF in (cd_size, cd_off) or disk:
            raise VstackError(f"{path}: ZIP64 or multi-disk archives are not supported")
        f.seek(cd_off)
        cd = f.read(cd_size)
    members, pos = [], 0
    for _ in range(n):
        fields = _CDH.unpack_from(cd, pos)
        if fields[0] != CD_SIG:
            raise VstackError(f"{path}: corrupt central directory")
        name_len, extra_len, comment_len, offset = (
            fields[10],
            fields[11],
            fields[12],
            fields[16],
        )
        rec_len = _CDH.size + name_len + extra_len + comment_len
        raw = cd[pos : pos + rec_len]
        name = raw[_CDH.size : _CDH.size + name_len].decode(
            "utf-8" if fields[3] & 0x800 else "cp437"
        )
        members.append(Member(name, offset, 0, raw))
        pos += rec_len
    by_offset = sorted(members, key=lambda m: m.offset)
    for m, nxt in zip(by_offset, by_offset[1:] + [None], strict=False):
        m.end = nxt.offset if nxt else cd_off
    return members, cd_off


def central_date_time(m: Member) -> tuple[int, int]:
    f = _CDH.unpack_from(m.central)
    return f[5], f[6]  # (time, date) in DOS form


def central_external_attr(m: Member) -> int:
    return _CDH.unpack_from(m.central)[15]


class WheelWriter:
    """Writes members in order; raw ranges from the source go through copy_file_range."""

    def __init__(self, out_path: Path, source: Path):
        self.f = open(out_path, "wb")  # noqa: SIM115 (closed in close())
        self.src = open(source, "rb")  # noqa: SIM115
        self.central: list[bytes] = []

    def copy_raw(self, members: list[Member]) -> None:
        """Copy members that are contiguous in the source, in one range copy."""
        if not members:
            return
        start, end = members[0].offset, members[-1].end
        base = self.f.tell()
        _copy_range(self.src, self.f, start, end - start)
        for m in members:
            rec = bytearray(m.central)
            struct.pack_into("<I", rec, 42, base + (m.offset - start))
            self.central.append(bytes(rec))

    def add(self, name: str, data: bytes, dos_time: tuple[int, int], attr: int) -> None:
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = comp.compress(data) + comp.flush()
        crc = zlib.crc32(data)
        raw_name = name.encode("utf-8")
        flags = 0x800 if not name.isascii() else 0
        t, d = dos_time
        offset = self.f.tell()
        self.f.write(
            _LFH.pack(
                LF_SIG, 20, flags, 8, t, d, crc, len(body), len(data), len(raw_name), 0
            )
            + raw_name
        )
        self.f.write(body)
        self.central.append(
            _CDH.pack(
                CD_SIG,
                (3 << 8) | 20,
                20,
                flags,
                8,
                t,
                d,
                crc,
                len(body),
                len(data),
                len(raw_name),
                0,
                0,
                0,
                0,
                attr,
                offset,
            )  # fmt: skip
            + raw_name
        )

    def close(self) -> None:
        cd_off = self.f.tell()
        for rec in self.central:
            self.f.write(rec)
        cd_size = self.f.tell() - cd_off
        n = len(self.central)
        if n >= 0xFFFF or cd_off >= 0xFFFFFFFF:
            raise VstackError("the output wheel would need ZIP64")
        self.f.write(_EOCD.pack(EOCD_SIG, 0, 0, n, n, cd_size, cd_off, 0))
        self.f.close()
        self.src.close()


def _copy_range(src, dst, offset: int, length: int) -> None:
    dst.flush()
    out_off = dst.tell()
    try:
        done = 0
        while done < length:
            n = os.copy_file_range(
                src.fileno(), dst.fileno(), length - done, offset + done, out_off + done
            )
            if n == 0:
                break
            done += n
        if done == length:
            dst.seek(out_off + length)
            return
    except (AttributeError, OSError):
        pass
    src.seek(offset)
    dst.seek(out_off)
    remaining = length
    while remaining:
        chunk = src.read(min(remaining, 1 << 22))
        if not chunk:
            raise VstackError("source wheel ended early")
        dst.write(chunk)
        remaining -= len(chunk)


def _seek_data(f, m: Member) -> tuple[int, int]:
    """Seek to a member's data after its local header; (method, compressed size)."""
    f.seek(m.offset)
    head = f.read(_LFH.size)
    sig, _, _, method, _, _, _, _, _, name_len, extra_len = _LFH.unpack(head)
    if sig != LF_SIG:
        raise VstackError(f"corrupt local header for {m.name}")
    f.seek(m.offset + _LFH.size + name_len + extra_len)
    return method, _CDH.unpack_from(m.central)[8]


def read_member(f, m: Member) -> bytes:
    """Decompressed bytes of one member, read from its local record."""
    method, csize = _seek_data(f, m)
    data = f.read(csize)
    if method == 0:
        return data
    if method == 8:
        return zlib.decompress(data, -15)
    raise VstackError(f"{m.name}: unsupported compression method {method}")


def read_named(
    path: Path, names: list[str], members: list[Member] | None = None
) -> dict[str, bytes]:
    """{name: bytes} for the named members (those present), without zipfile's full scan."""
    if members is None:
        members, _ = read_members(path)
    wanted = set(names)
    with open(path, "rb") as f:
        return {m.name: read_member(f, m) for m in members if m.name in wanted}


def _member_digest(f, m: Member) -> tuple[bytes, int]:
    """(sha256 digest, size) of a member's decompressed bytes, read in chunks."""
    import hashlib

    method, left = _seek_data(f, m)
    if method not in (0, 8):
        raise VstackError(f"{m.name}: unsupported compression method {method}")
    inflate = zlib.decompressobj(-15) if method == 8 else None
    h, size = hashlib.sha256(), 0
    while left:
        chunk = f.read(min(left, 1 << 22))
        if not chunk:
            raise VstackError(f"{m.name}: the archive ends inside it")
        left -= len(chunk)
        data = inflate.decompress(chunk) if inflate else chunk
        h.update(data)
        size += len(data)
    if inflate:
        tail = inflate.flush()
        h.update(tail)
        size += len(tail)
    return h.digest(), size


def record_problems(path: Path) -> list[str]:
    """What a wheel's RECORD says that its members do not (PEP 376/427): every
    member but RECORD (and its signatures) listed once with the sha256 and size of
    its bytes, and no row for a file the wheel lacks. [] when it holds."""
    import base64
    import csv
    import io
    import re

    members, _ = read_members(path)
    records = [m for m in members if re.fullmatch(r"[^/]+\.dist-info/RECORD", m.name)]
    if len(records) != 1:
        return [f"{len(records)} *.dist-info/RECORD files (a wheel has one)"]
    record = records[0]
    skip = {record.name, record.name + ".jws", record.name + ".p7s"}
    with open(path, "rb") as f:
        rows = list(csv.reader(io.StringIO(read_member(f, record).decode("utf-8"))))
        listed: dict[str, tuple[str, str]] = {}
        found = []
        for row in rows:
            if not row:
                continue
            name, digest, size = (row + ["", ""])[:3]
            if name in listed:
                found.append(f"{name} is listed twice")
            listed[name] = (digest, size)
        names = {m.name for m in members}
        for m in members:
            if m.name in skip or m.name.endswith("/"):
                continue
            if m.name not in listed:
                found.append(f"{m.name} is not listed")
                continue
            digest, size = listed[m.name]
            got, n = _member_digest(f, m)
            want = "sha256=" + base64.urlsafe_b64encode(got).rstrip(b"=").decode()
            if digest != want:
                found.append(f"{m.name}: RECORD says {digest or '(no hash)'}, the file "
                             f"is {want}")  # fmt: skip
            elif size and size != str(n):
                found.append(f"{m.name}: RECORD says {size} bytes, the file has {n}")
        found += [f"{n} is listed but not in the wheel" for n in listed
                  if n not in names and n not in skip]  # fmt: skip
    return found


def verify_record(path: Path) -> None:
    """Refuse a wheel whose RECORD does not match its members: vstack build copies
    the RECORD lines of every member it does not change."""
    found = record_problems(path)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise VstackError(
            f"{path.name}: its RECORD does not match its files: {found[0]}{more}; a "
            f"build from it would state a wrong hash: get an intact wheel"
        )
