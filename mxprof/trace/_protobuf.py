"""Protobuf wire format for the Perfetto traces mxprof reads and writes:
field numbers of the messages the core's writer uses (native/src/mxp_perfetto.c)
and the encoding of fields.  No protobuf library is needed."""

from __future__ import annotations

# Wire types.
VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
# TracePacket (trace_packet.proto).
PK_CLOCK_SNAPSHOT, PK_TIMESTAMP, PK_SEQUENCE_ID, PK_TRACK_EVENT = 6, 8, 10, 11
PK_INTERNED_DATA, PK_SEQUENCE_FLAGS, PK_CLOCK_ID, PK_TRACK_DESCRIPTOR = 12, 13, 58, 60
PK_DEFAULTS = 59  # TracePacketDefaults (trace_packet_defaults.proto)
DEF_TIMESTAMP_CLOCK_ID, DEF_TRACK_EVENT, TED_TRACK_UUID = 58, 11, 11  # ... TrackEventDefaults
SEQ_INCREMENTAL_STATE_CLEARED = 1
CLOCK_REALTIME, CLOCK_MONOTONIC = 1, 3
# TrackDescriptor, ProcessDescriptor, ThreadDescriptor.
TD_UUID, TD_NAME, TD_PROCESS, TD_THREAD, TD_PARENT_UUID, TD_COUNTER = 1, 2, 3, 4, 5, 8
DESC_PID, THD_TID, THD_THREAD_NAME, PD_PROCESS_NAME = 1, 2, 5, 6
# TrackEvent and DebugAnnotation.
TE_CATEGORY_IIDS, TE_DEBUG_ANNOTATIONS, TE_TYPE, TE_NAME_IID = 3, 4, 9, 10
TE_TRACK_UUID, TE_CATEGORIES, TE_NAME, TE_COUNTER_VALUE = 11, 22, 23, 30
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
DA_BOOL, DA_UINT, DA_INT, DA_DOUBLE, DA_STRING, DA_NAME = 2, 3, 4, 5, 6, 10
# InternedData.
ID_EVENT_CATEGORIES, ID_EVENT_NAMES, INTERNED_IID, INTERNED_NAME = 1, 2, 1, 2
# TracePacket.chrome_events: a ChromeEventBundle, whose metadata (field 2) are
# ChromeMetadata {name = 1; string_value = 2, bool_value = 3, int_value = 4
# or json_value = 5}: Chrome JSON's top-level keys (merge's distributedInfo).
PK_CHROME_EVENTS, CE_METADATA = 5, 2
CM_NAME, CM_STRING, CM_BOOL, CM_INT, CM_JSON = 1, 2, 3, 4, 5

GLOBAL_TRACK = 0


def put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def put_uint(out: bytearray, field: int, value: int) -> None:
    put_varint(out, field << 3)
    put_varint(out, value)


def put_bytes(out: bytearray, field: int, value: bytes | bytearray) -> None:
    put_varint(out, field << 3 | BYTES)
    put_varint(out, len(value))
    out += value


def put_str(out: bytearray, field: int, value: str) -> None:
    put_bytes(out, field, value.encode("utf-8", errors="surrogatepass"))


def put_packet(out: bytearray, body: bytearray) -> None:
    put_bytes(out, 1, body)
