"""Human-readable (and JSON) descriptions of idemlink frames, for ``monitor`` and ``link --monitor``.

``FrameDescriber.describe(item)`` takes what ``idemlink.protocol.frame.FrameDecoder`` yields (a ``Frame`` or
a ``DecodeError``) and returns ``{"type", "epoch", "seq", "flags", "text"}`` (``epoch`` an integer,
as in every JSON output; the text shows it in hex) (or ``{"type":
"ERROR", "error", "text"}``), plus what it decoded: ``function`` (a request's or answer's
function code), ``status`` (an answer's), ``registers`` (``[{"name", "address", "raw", "value",
"label", "unit"}]`` for writes and read answers, ``register_json``), ``code`` (a
trigger answer's), ``device`` (a HELLO reply's id, map and limits), ``address`` (an addressed
frame's, on a bus: absent from a point-to-point frame). It remembers requests by
(epoch, seq), so an answer can name the registers its request touched. It never raises: what it
cannot parse it shows as hex. A HELLO reply advertising another map than the one it decodes with
is said once, in that reply's text; from then on registers are shown by address only (``@3=…``,
``name`` null), never under the names of the wrong map.
"""

from __future__ import annotations

import math
from typing import Any

from idemlink.protocol.registers import RegisterMap, RegisterSpec, TriggerStatus
from idemlink.protocol.regmap_file import DEFAULT_MAP


def register_json(spec: RegisterSpec | None, address: int, raw: int) -> dict[str, Any]:
    """A register's reading as every JSON output lists it: ``raw`` the 16-bit word (for a value
    of several registers the integer its words make, most significant first: ``RegisterSpec``'s
    raw value), ``value`` a number (``RegisterSpec.value``: the scaled value with the map's
    scale or offset, the signed or float number of its type, else the raw word) or, for a string
    register, its text; ``label`` the map's name for that value (``"auto"``) or null, ``unit``
    the map's (``""`` without one); ``fields`` (``{NAME: value}``) for a register with bit
    fields. A register the map does not declare has ``name`` null and ``value`` the raw word.
    An f32/f64 that is NaN or infinite (JSON has neither) has ``value`` null and ``text``
    ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    if spec is None:
        return {"name": None, "address": address, "raw": raw, "value": raw, "label": None,
                "unit": ""}
    value = spec.value(raw)
    out = {"name": spec.name, "address": address, "raw": raw, "value": value,
           "label": spec.label_of(raw), "unit": spec.unit}
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or Infinity: the value is null and "text" says which it is
        out["value"] = None
        out["text"] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if spec.fields:
        out["fields"] = spec.field_values(raw)
    return out


def trigger_code_name(code: int) -> str:
    """``RUNNING`` for 0x0101 and so on; hex for a code this version does not know."""
    try:
        return TriggerStatus(code).name
    except ValueError:
        return f"0x{code:04X}"


class FrameDescriber:
    """Human-readable and JSON descriptions of the frames passing by (remembers requests by
    (epoch, seq) so a read answer can name its registers)."""

    def __init__(self, regmap: RegisterMap = DEFAULT_MAP) -> None:
        self.regmap = regmap
        self._requests: dict[tuple[int, int], Any] = {}
        self.raw_addresses = False  #: a device advertised another map: no names from ours

    def _at(self, address: int) -> RegisterSpec | None:
        """The register at ``address``, to name a word by (a word of a value of several
        registers is shown by address: one word alone is no value of it)."""
        spec = None if self.raw_addresses else self.regmap.at(address)
        return spec if spec is None or spec.words == 1 else None

    def _map_mismatch(self, map_name: str | None, map_hash: bytes | None) -> str:
        """The note, said once, when a device advertises another map than ``self.regmap``."""
        if map_hash is None or map_hash == self.regmap.hash or self.raw_addresses:
            return ""
        self.raw_addresses = True
        return (f" [not the map decoded with, {self.regmap.name} {self.regmap.hash.hex()}: "
                f"registers shown by address from here on; give --regmap FILE with "
                f"{map_name or 'its'} map to see names]")

    def _reg(self, address: int) -> str:
        spec = self._at(address)
        return spec.name if spec is not None else f"@{address}"

    def _regs(self, address: int, values: tuple[int, ...] | list[int]) -> list[dict[str, Any]]:
        return [register_json(self._at(address + i), address + i, raw)
                for i, raw in enumerate(values)]

    def _shown(self, address: int, raw: int) -> str:
        spec = self._at(address)
        if spec is None:
            return f"@{address}={raw}"
        text = spec.show(raw)
        return f"{spec.name}={raw}" if text == str(raw) else f"{spec.name}={raw} ({text})"

    def describe(self, item: Any) -> dict[str, Any]:
        from idemlink.protocol.frame import DecodeError, FrameType

        if isinstance(item, DecodeError):
            return {"type": "ERROR", "error": item.kind.name, "text": f"! {item.kind.name}: "
                    f"{item.detail}"}
        f = item
        head = {"type": f.type.name, "epoch": f.epoch, "seq": f.seq,
                "flags": [fl.name for fl in type(f.flags) if fl and fl in f.flags and fl.name]}
        flags = ("[" + ",".join(head["flags"]) + "] ") if head["flags"] else ""
        prefix = f"{f.type.name:<11} epoch={f.epoch:08x} seq={f.seq} {flags}"
        if f.address is not None:  # an addressed frame (a bus): who it is for or from
            head["address"] = f.address
            prefix += "broadcast " if f.address == 0 else f"address={f.address} "
        try:
            if f.type is FrameType.HELLO:
                body = f"version={f.payload[0]} contract={f.payload[1:9].hex()}"
            elif f.type is FrameType.HELLO_REPLY:
                from idemlink.protocol.payloads import DeviceInfo
                info = DeviceInfo.decode(f.payload)
                body = (f"{info.name!r} version={info.version} window={info.window} "
                        f"inflight={info.max_inflight} next_seq={info.next_seq} "
                        f"contract={info.contract_hash.hex()}")
                if info.map_hash is not None:
                    body += (f" device={info.device_id} map={info.map_name} "
                             f"{info.map_hash.hex()}")
                    body += self._map_mismatch(info.map_name, info.map_hash)
                head["device"] = {"id": info.device_id, "name": info.name,
                                  "map": info.map_name,
                                  "map_hash": info.map_hash.hex() if info.map_hash else None,
                                  "window": info.window, "next_seq": info.next_seq}
            elif f.type is FrameType.REQUEST:
                head["function"] = f.payload[0] if f.payload else None
                body = self._request(f.epoch, f.seq, f.payload, head)
            else:
                body = self._response(f.epoch, f.seq, f.payload, head)
        except Exception as exc:  # a monitor shows what it cannot parse, it never stops on it
            body = f"payload {f.payload.hex()} (undecodable: {exc})"
        head["text"] = prefix + body
        return head

    def _request(self, epoch: int, seq: int, pdu: bytes,
                 head: dict[str, Any] | None = None) -> str:
        head = {} if head is None else head
        from idemlink.protocol import modbus as mb

        if pdu[:1] == bytes([mb.FunctionCode.FILE_INFO]):
            return f"FC45 file info {mb.decode_file_info_request(pdu).name!r}"
        if pdu[:1] == bytes([mb.FunctionCode.FILE_RECEIVE]):
            return "FC44 file receive" + (" (overwrite)" if pdu[1:] == b"\x01" else "")
        req = mb.decode_request(pdu)
        self._requests[(epoch, seq)] = req
        if len(self._requests) > 4096:
            self._requests.pop(next(iter(self._requests)))
        match req:
            case mb.ReadRegisters(function, address, count):
                return f"FC{function:02X} read {self._reg(address)}({address}) x{count}"
            case mb.WriteSingleRegister(address, value):
                head["registers"] = self._regs(address, [value])
                return f"FC06 write {self._shown(address, value)}"
            case mb.WriteMultipleRegisters(address, values):
                head["registers"] = self._regs(address, values)
                return "FC10 write " + " ".join(
                    self._shown(address + i, v) for i, v in enumerate(values))
            case mb.WriteIfGeneration(generation, address, values):
                head["registers"] = self._regs(address, values)
                return f"FC41 if generation={generation}: write " + " ".join(
                    self._shown(address + i, v) for i, v in enumerate(values))
            case mb.TriggerRequest(address, value):
                head["registers"] = self._regs(address, [value])
                return f"FC42 trigger {self._reg(address)} {'start' if value == 1 else value}"
        return pdu.hex()

    def _response(self, epoch: int, seq: int, payload: bytes,
                  head: dict[str, Any] | None = None) -> str:
        head = {} if head is None else head
        from idemlink.protocol import modbus as mb
        from idemlink.protocol.outcome import known_status
        from idemlink.protocol.payloads import decode_response_payload

        decoded = decode_response_payload(payload)
        if decoded is None:
            return "empty payload"
        status, pdu = decoded
        known = known_status(status)
        st = known.name if known is not None else f"0x{status:02X}"
        head["status"] = st
        if not pdu:
            return f"status={st}"
        head["function"] = pdu[0]
        resp = mb.decode_response(pdu)
        req = self._requests.get((epoch, seq))
        match resp:
            case mb.ReadRegistersResponse(_, values):
                if isinstance(req, mb.ReadRegisters):
                    head["registers"] = self._regs(req.address, values)
                    text = " ".join(self._shown(req.address + i, v)
                                    for i, v in enumerate(values))
                else:
                    text = " ".join(str(v) for v in values)
                return f"status={st} read {text}"
            case mb.WriteSingleRegisterResponse(address, value):
                return f"status={st} wrote {self._reg(address)}={value}"
            case mb.WriteMultipleRegistersResponse(address, count):
                return f"status={st} wrote {count} from {self._reg(address)}"
            case mb.WriteIfGenerationResponse(wst, generation):
                return f"status={st} conditional {wst.name} generation={generation}"
            case mb.TriggerResponse(address, code):
                head["code"] = code
                return f"status={st} trigger {self._reg(address)} {trigger_code_name(code)}"
            case mb.FileInfoResponse(fst, size, crc):
                if fst is mb.FileInfoStatus.ABSENT:
                    return f"status={st} file absent"
                return f"status={st} file {size} bytes crc32c={crc:08x}"
            case mb.ExceptionResponse(function, exception):
                return f"status={st} FC{function:02X} exception {exception.name}"
        return f"status={st} {pdu.hex()}"
