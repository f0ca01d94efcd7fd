package kafka

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
)

// Commit metadata: like Confluent's Parallel Consumer, a commit carries the
// offsets above the committed one that are already settled, so that the
// next owner of the partition (or this member after a crash) skips them and
// replays only unsettled records. Kafka bounds metadata (offset.metadata.
// max.bytes, 4096 by default); the set is cut to fit, which only means more
// replays, never a loss. A set is believed only if it decodes cleanly
// (decodeSettled) and names records below the partition's end when it is
// assigned (Source.onAssigned).

// metaPrefix marks ackwise's metadata; other metadata is ignored. After it
// comes the committed offset the set was encoded against, then ":" and the
// set: a tool that moves the committed offset and copies the metadata along
// (kadm's FetchOffsets, edit, CommitOffsets does) leaves a base that no
// longer matches, and the set is ignored. Read against the new offset, its
// deltas would name other records, and the next owner would skip records
// nobody settled. ("ackwise1:" metadata, without the base, is ignored for
// the same reason: its records are redelivered once.)
const metaPrefix = "ackwise2:"

// maxMetaBytes keeps the encoded metadata under Kafka's default limit.
const maxMetaBytes = 3000

// encodeSettled encodes offsets (ascending, all > base) as uvarint deltas.
func encodeSettled(base int64, offs []int64) string {
	if len(offs) == 0 {
		return ""
	}
	head := metaPrefix + strconv.FormatInt(base, 10) + ":"
	buf := make([]byte, 0, len(offs)*2)
	prev := base
	var tmp [binary.MaxVarintLen64]byte
	for _, o := range offs {
		n := binary.PutUvarint(tmp[:], uint64(o-prev))
		if base64.RawURLEncoding.EncodedLen(len(buf)+n)+len(head) > maxMetaBytes {
			break
		}
		buf = append(buf, tmp[:n]...)
		prev = o
	}
	return head + base64.RawURLEncoding.EncodeToString(buf)
}

// decodeSettled is the inverse of encodeSettled; it returns nil for metadata
// it does not recognize or that was encoded against another base than the
// committed offset base. Anyone allowed to commit for the group can write
// the metadata, so it is read as untrusted: metadata longer than
// encodeSettled writes, malformed past its prefix (bad base64, a cut or
// zero delta), with a negative base, or whose deltas go past MaxInt64
// (int64 addition would wrap to offsets below the base) is ignored as a
// whole. Ignored, it costs redeliveries of the settled records above base,
// never a skip of records nobody settled.
func decodeSettled(base int64, meta string) map[int64]struct{} {
	if base < 0 || len(meta) > maxMetaBytes {
		return nil
	}
	rest, ok := strings.CutPrefix(meta, metaPrefix)
	if !ok {
		return nil
	}
	at, set, ok := strings.Cut(rest, ":")
	if !ok || at != strconv.FormatInt(base, 10) {
		return nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(set)
	if err != nil {
		return nil
	}
	out := make(map[int64]struct{})
	prev := base
	for len(raw) > 0 {
		d, n := binary.Uvarint(raw)
		if n <= 0 || d == 0 || d > uint64(math.MaxInt64-prev) {
			return nil
		}
		raw = raw[n:]
		prev += int64(d)
		out[prev] = struct{}{}
	}
	return out
}
