"""The SSE decoder splits a byte stream into frames, keeping each frame's bytes as received; the
answer reader finds a request's answer among them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.sse import AnswerReader, Frame, FrameTooLarge, SSEDecoder, encode_event

LINE_ENDS = {"LF": b"\n", "CRLF": b"\r\n", "CR": b"\r"}


def feed_all(
    stream: bytes, chunks: list[int] | None = None, **kwargs: int
) -> tuple[list[Frame], bytes]:
    """Feed `stream` whole, or cut at the given offsets; return the frames and the pending tail."""
    decoder = SSEDecoder(**kwargs)
    cuts = [0, *sorted(chunks or []), len(stream)]
    frames: list[Frame] = []
    for start, end in itertools.pairwise(cuts):
        frames.extend(decoder.feed(stream[start:end]))
    return frames, decoder.pending()


def one_byte_at_a_time(stream: bytes) -> tuple[list[Frame], bytes]:
    return feed_all(stream, list(range(1, len(stream))))


def fields(frames: list[Frame]) -> list[tuple[str | None, str | None]]:
    return [(frame.event, frame.data) for frame in frames]


@pytest.mark.parametrize("ending", ["LF", "CRLF"])
def test_frames_end_at_blank_lines(ending: str) -> None:
    nl = LINE_ENDS[ending]
    stream = b"data: one" + nl + nl + b"event: message" + nl + b"data: two" + nl + nl

    frames, pending = feed_all(stream)

    assert fields(frames) == [(None, "one"), ("message", "two")]
    assert [frame.raw for frame in frames] == [
        b"data: one" + nl + nl,
        b"event: message" + nl + b"data: two" + nl + nl,
    ]
    assert pending == b""
    assert one_byte_at_a_time(stream) == (frames, pending)


def test_cr_line_ends_split_frames_once_the_next_byte_shows_no_lf_follows() -> None:
    """A CR ending the input may be half of a CRLF, so the decoder waits for one more byte."""
    stream = b"data: one\r\rdata: two\r\r"

    frames, pending = feed_all(stream)

    assert fields(frames) == [(None, "one")]
    assert pending == b"data: two\r\r"
    assert one_byte_at_a_time(stream) == (frames, pending)

    decoder = SSEDecoder()
    assert fields(decoder.feed(stream)) == [(None, "one")]
    assert fields(decoder.feed(b":")) == [(None, "two")]
    assert decoder.pending() == b":"


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()

    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\n\r") == []
    frames = decoder.feed(b"\n")

    assert fields(frames) == [(None, "x")]
    assert frames[0].raw == b"data: x\r\n\r\n"
    assert decoder.pending() == b""


def test_mixed_line_ends_in_one_stream_are_all_honoured() -> None:
    stream = b"data: a\ndata: b\r\n\r\ndata: c\r\n\n: keep-alive\r\n\r\n"

    frames, pending = feed_all(stream)

    assert fields(frames) == [(None, "a\nb"), (None, "c"), (None, None)]
    assert pending == b""


def test_a_comment_only_frame_has_no_data() -> None:
    frames, _ = feed_all(b": keep-alive\n\n:\r\n\r\n")

    assert fields(frames) == [(None, None), (None, None)]
    assert [frame.raw for frame in frames] == [b": keep-alive\n\n", b":\r\n\r\n"]


def test_data_lines_are_joined_with_newlines() -> None:
    frames, _ = feed_all(b'data: {"a":\ndata:  1}\ndata\ndata:x\n\n')

    assert frames[0].data == '{"a":\n 1}\n\nx'


def test_only_one_space_after_the_colon_is_dropped() -> None:
    frames, _ = feed_all(b"data:  two spaces \n\n")

    assert frames[0].data == " two spaces "


def test_the_event_field_names_the_event_and_other_fields_are_ignored() -> None:
    frames, _ = feed_all(b"id: 7\nretry: 10\nevent: ping\nfoo: bar\ndata: x\n\nevent: only\n\n")

    assert fields(frames) == [("ping", "x"), ("only", None)]


def test_an_unfinished_frame_stays_pending() -> None:
    decoder = SSEDecoder()

    assert decoder.feed(b"data: a\n\ndata: b\n") != []
    assert decoder.pending() == b"data: b\n"


def test_a_frame_growing_past_the_bound_is_refused() -> None:
    decoder = SSEDecoder(max_frame_bytes=32)
    decoder.feed(b"data: " + b"x" * 20)

    with pytest.raises(FrameTooLarge):
        decoder.feed(b"x" * 20)


def test_a_complete_frame_past_the_bound_is_refused_even_in_one_chunk() -> None:
    with pytest.raises(FrameTooLarge):
        SSEDecoder(max_frame_bytes=32).feed(b"data: " + b"x" * 40 + b"\n\n")


def test_the_bound_is_per_frame_not_per_chunk() -> None:
    small = b"data: " + b"x" * 10 + b"\n\n"

    frames, pending = feed_all(small * 20, max_frame_bytes=32)

    assert len(frames) == 20
    assert pending == b""


# --- any chunking gives the same frames ---------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@dataclass
class Event:
    event: str | None
    data: list[str]
    comment: str | None

    def encode(self, nl: bytes) -> bytes:
        lines: list[str] = []
        if self.comment is not None:
            lines.append(":" + self.comment)
        if self.event is not None:
            lines.append("event: " + self.event)
        lines.extend("data: " + line for line in self.data)
        return b"".join(line.encode() + nl for line in lines) + nl

    def expected(self) -> tuple[str | None, str | None]:
        return self.event, "\n".join(self.data) if self.data else None


_events = st.builds(
    Event,
    event=st.none() | _text,
    data=st.lists(_text, max_size=3),
    comment=st.none() | _text,
).filter(lambda e: e.event is not None or e.data or e.comment is not None)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_events, min_size=1, max_size=5),
    ending=st.sampled_from(sorted(LINE_ENDS)),
    data=st.data(),
)
def test_any_chunking_of_a_valid_stream_gives_the_same_frames(
    events: list[Event], ending: str, data: st.DataObject
) -> None:
    nl = LINE_ENDS[ending]
    stream = b"".join(event.encode(nl) for event in events)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=12))

    whole, whole_pending = feed_all(stream)
    frames, pending = feed_all(stream, cuts)

    assert (frames, pending) == (whole, whole_pending)
    assert b"".join(frame.raw for frame in frames) + pending == stream
    expected = [event.expected() for event in events]
    if ending == "CR":  # the last CR may still become a CRLF: its frame waits
        assert fields(frames) == expected[:-1]
        assert pending == events[-1].encode(nl)
    else:
        assert fields(frames) == expected
        assert pending == b""


@settings(max_examples=300, deadline=None)
@given(
    stream=st.lists(
        st.sampled_from([b"\r", b"\n", b"\r\n", b"data: x", b":", b"event: e", b"\xff"])
    ).map(b"".join),
    data=st.data(),
)
def test_any_chunking_of_any_bytes_gives_the_same_frames(
    stream: bytes, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=12))

    whole = feed_all(stream)
    frames, pending = feed_all(stream, cuts)

    assert (frames, pending) == whole
    assert b"".join(frame.raw for frame in frames) + pending == stream


# --- encode_event -------------------------------------------------------------------------


def decode_one(raw: bytes) -> Frame:
    frames, pending = feed_all(raw)
    assert pending == b""
    assert len(frames) == 1
    return frames[0]


@settings(max_examples=200, deadline=None)
@given(
    data=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r")),
    event=st.none() | _text.filter(bool),
)
def test_an_encoded_event_decodes_to_the_same_data(data: str, event: str | None) -> None:
    frame = decode_one(encode_event(data, event=event))

    assert frame.data == data
    assert frame.event == event


@pytest.mark.parametrize(
    "data",
    [
        "",
        "\n",
        "a\n",
        "\na",
        "a\n\nb",
        '{"text":"line\u2028separator"}',
        '{"text":"next\u0085line"}',
        "form\x0cfeed\x0bvtab\x1cfs",
        "para\u2029graph",
    ],
)
def test_only_sse_line_breaks_split_data_lines(data: str) -> None:
    assert decode_one(encode_event(data)).data == data


def test_carriage_returns_in_data_arrive_as_newlines() -> None:
    assert decode_one(encode_event("a\r\nb\rc")).data == "a\nb\nc"


def test_an_event_name_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        encode_event("x", event="message\ndata: injected")


def test_the_answer_reader_passes_over_requests_notifications_and_events_that_are_not_json() -> (
    None
):
    reader = AnswerReader(7)
    before = (
        b'data: {"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}\n\n'
        b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
        b"data: not json\n\n"
        b'data: {"jsonrpc":"2.0","id":8,"result":{}}\n\n'
    )
    assert reader.feed(before) is None
    # An answer whose text says "method" is the answer all the same; split across chunks.
    answer = b'data: {"jsonrpc":"2.0","id":7,"result":{"text":"the \\"method\\" key"}}\n\n'
    assert reader.feed(answer[:20]) is None
    found = reader.feed(answer[20:])
    assert found is not None
    message, data = found
    assert message["result"] == {"text": 'the "method" key'}
    assert data.encode() == answer[len(b"data: ") : -2]


def test_the_answer_reader_bounds_an_event_that_never_ends() -> None:
    reader = AnswerReader(1, max_frame_bytes=64)
    with pytest.raises(FrameTooLarge):
        reader.feed(b"data: " + b"x" * 100)
