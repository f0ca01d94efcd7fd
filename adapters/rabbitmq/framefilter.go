package rabbitmq

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net"
)

// Header tables the client library cannot read.
//
// amqp091-go refuses to read a field table or array nested deeper than 32
// levels or holding more than 8192 entries (read.go: maxFieldDepth,
// maxContainerElements), although RabbitMQ stores and delivers such a
// message. Its reader then closes the whole connection (a 501 frame error
// of its own, not the broker's): the deliveries in flight go back to the
// queue, the poison first, and the next connection dies the same way, so one
// message a producer crafted would stop the consumer for good and, on a
// quorum queue, add to the x-delivery-count of every message in flight at
// each close. frameFilter sits between the socket (after TLS) and
// amqp091-go and makes such a header table readable before amqp091-go
// sees it: each entry it could not read is passed on as a byte array ('x')
// holding the entry's encoded value (the table's or array's bytes after its
// type and length), and the names of those entries are listed in
// HeaderUnreadable. Everything else passes through unchanged.
const (
	// HeaderUnreadable lists, as a JSON array of strings, the header
	// entries of a delivery that amqp091-go could not read (a table or
	// array nested deeper than 32 levels or with more than 8192 entries,
	// or a malformed value). The adapter sets it on the delivery (and so
	// moves and dead letters carry it); each listed entry's value is then
	// a byte array holding its encoded value. It is informational: a
	// producer can set it too.
	HeaderUnreadable = "ackwise-unreadable-headers"
	// HeaderUnreadableRest holds, as a byte array, the encoded entries of
	// a header table that follow one that could not be delimited, or that
	// exceed 8192 entries; it is then listed in HeaderUnreadable.
	HeaderUnreadableRest = "ackwise-unreadable-headers-rest"
)

// AMQP 0-9-1 framing (section 2.3.5) and amqp091-go's read limits.
const (
	frameMethod    = 1
	frameHeader    = 2
	frameEndOctet  = 0xCE
	frameOverhead  = 1 + 2 + 4 + 1 // type, channel, size; frame-end
	frameMinSize   = 4096          // the smallest frame_max AMQP allows
	maxFieldDepth  = 32            // amqp091-go read.go
	maxTableFields = 8192          // amqp091-go read.go: maxContainerElements

	// maxInspected bounds the content header frame the filter buffers when
	// no frame_max was negotiated (0: unlimited); a larger one passes
	// unread.
	maxInspected = 16 << 20

	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
	flagDeliveryMode    = 0x1000
	flagPriority        = 0x0800
	flagCorrelationID   = 0x0400
	flagReplyTo         = 0x0200
	flagExpiration      = 0x0100
	flagMessageID       = 0x0080
)

// unreadable describes a header table the filter made readable.
type unreadable struct {
	channel   uint16
	messageID string
	names     []string
	reason    string
	kept      bool // the entries' encoded values were kept (not dropped to fit the frame)
}

// frameFilter reads the frames the broker sends and passes them on,
// making unreadable header tables readable (see HeaderUnreadable). It
// learns the negotiated frame_max from connection.tune, so that a frame it
// rewrites stays within it. Not safe for concurrent Reads (amqp091-go has
// one reader).
type frameFilter struct {
	net.Conn
	r         *bufio.Reader
	out       []byte // the rest of a frame read whole, to hand out
	pass      int64  // bytes of the current frame still to pass through
	clientMax int    // the frame_max the client asks for
	frameMax  int    // negotiated (clientMax until connection.tune); 0: unlimited
	buf, wbuf []byte
	report    func(unreadable)
}

// newFrameFilter filters what c reads. clientMax is the frame_max the
// client asks for (amqp.Config.FrameSize); report is called for each
// header table made readable.
func newFrameFilter(c net.Conn, clientMax int, report func(unreadable)) *frameFilter {
	return &frameFilter{Conn: c, r: bufio.NewReaderSize(c, 64<<10), clientMax: clientMax, frameMax: clientMax, report: report}
}

func (f *frameFilter) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if len(f.out) > 0 {
			n := copy(p, f.out)
			f.out = f.out[n:]
			return n, nil
		}
		if f.pass > 0 {
			n, err := f.r.Read(p[:min(int64(len(p)), f.pass)])
			f.pass -= int64(n)
			return n, err
		}
		if err := f.next(); err != nil {
			return 0, err
		}
	}
}

// next starts the next frame: it reads a content header frame whole (and
// makes its header table readable), notes frame_max from connection.tune,
// and lets any other frame pass through.
func (f *frameFilter) next() error {
	hdr, err := f.r.Peek(7)
	if err != nil {
		if len(hdr) > 0 {
			// Not a whole frame header: the client fails on it.
			f.pass = int64(len(hdr))
			return nil
		}
		return err
	}
	typ, channel, size := hdr[0], binary.BigEndian.Uint16(hdr[1:3]), binary.BigEndian.Uint32(hdr[3:7])
	total := int64(size) + frameOverhead
	limit := f.frameMax
	if limit == 0 {
		limit = maxInspected
	}
	switch {
	case typ == frameHeader && total <= int64(limit):
		return f.header(channel, int(total))
	case typ == frameMethod && channel == 0 && size >= 10:
		f.tune()
	}
	f.pass = total
	return nil
}

// tune notes the negotiated frame_max when the frame ahead is
// connection.tune (class 10, method 30: channel-max, frame-max,
// heartbeat), as amqp091-go negotiates it.
func (f *frameFilter) tune() {
	b, err := f.r.Peek(7 + 10)
	if err != nil || binary.BigEndian.Uint16(b[7:9]) != 10 || binary.BigEndian.Uint16(b[9:11]) != 30 {
		return
	}
	server := int(binary.BigEndian.Uint32(b[13:17]))
	n := f.clientMax
	switch {
	case n == 0 || server == 0:
		n = max(n, server)
	default:
		n = min(n, server)
	}
	if n > 0 && n < frameMinSize {
		n = frameMinSize
	}
	f.frameMax = n
}

// header reads a content header frame of total bytes and queues it to hand
// out, its header table made readable.
func (f *frameFilter) header(channel uint16, total int) error {
	if cap(f.buf) < total {
		f.buf = make([]byte, total)
	}
	b := f.buf[:total]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return err
	}
	f.out = b
	if b[total-1] != frameEndOctet {
		return nil // the client fails on it
	}
	limit := f.frameMax - frameOverhead
	if f.frameMax == 0 {
		limit = math.MaxInt32
	}
	payload, u, ok := readableHeader(b[7:total-1], limit, f.wbuf[:0])
	if !ok {
		return nil
	}
	f.wbuf = payload[:0]
	out := append(b[:0:0], b[:7]...)
	binary.BigEndian.PutUint32(out[3:7], uint32(len(payload)))
	out = append(out, payload...)
	out = append(out, frameEndOctet)
	f.out = out
	u.channel = channel
	if f.report != nil {
		f.report(u)
	}
	return nil
}

// readableHeader returns the content header payload p (class-id, weight,
// body size, property flags, properties) with its header table made
// readable, appended to dst, at most limit bytes long, and what it
// changed; ok is false when p's header table reads as it is (or p is not
// well formed enough to tell: the client then fails on it as before).
func readableHeader(p []byte, limit int, dst []byte) (out []byte, u unreadable, ok bool) {
	if len(p) < 14 {
		return nil, u, false
	}
	flags := binary.BigEndian.Uint16(p[12:14])
	if flags&flagHeaders == 0 {
		return nil, u, false
	}
	off := 14
	for _, fl := range []uint16{flagContentType, flagContentEncoding} {
		if flags&fl != 0 {
			if off >= len(p) {
				return nil, u, false
			}
			off += 1 + int(p[off])
		}
	}
	if off+4 > len(p) {
		return nil, u, false
	}
	n := int64(binary.BigEndian.Uint32(p[off : off+4]))
	end := int64(off+4) + n
	if end > int64(len(p)) {
		return nil, u, false
	}
	table := p[off+4 : end]
	if _, why := checkTable(table, 0); why == "" {
		return nil, u, false
	}
	rest := p[end:]
	// Keep the unreadable values' bytes and name them; if that does not
	// fit the frame (the marker adds a little), drop the bytes, then the
	// names, then the marker and the rest's entry: the table is then no
	// larger than it was.
	for step := range 4 {
		out = append(dst[:0], p[:off]...)
		out = append(out, 0, 0, 0, 0)
		keep := step == 0
		out, u.names, u.reason = readableTable(out, table, keep, step < 3)
		u.kept = keep
		switch step {
		case 0, 1:
			out = appendMarker(out, u.names)
		case 2:
			out = appendMarker(out, []string{})
		}
		binary.BigEndian.PutUint32(out[off:off+4], uint32(len(out)-off-4))
		out = append(out, rest...)
		if len(out) <= limit {
			break
		}
	}
	u.messageID = messageIDOf(out, flags, off)
	return out, u, true
}

// readableTable appends to dst the entries of the encoded table t (without
// its length) that amqp091-go reads, each other one as a byte array (its
// content, or nothing unless keep) with its name in names, and the entries
// it cannot delimit or count as one byte array HeaderUnreadableRest
// (unless rest is false: then they are dropped), and returns why they
// could not be read. A producer's own HeaderUnreadable is dropped: the
// caller appends the real one.
func readableTable(dst, t []byte, keep, rest bool) (out []byte, names []string, reason string) {
	out = dst
	i, fields := 0, 0
	for i < len(t) {
		if fields == maxTableFields-2 { // room for the rest and the marker
			reason = firstOf(reason, "more than 8192 entries in the table")
			break
		}
		klen := int(t[i])
		j := i + 1 + klen
		if j >= len(t) {
			reason = firstOf(reason, "a malformed entry")
			break
		}
		key := t[i+1 : j]
		n, why := checkField(t[j:], 0)
		if why == "" {
			if string(key) != HeaderUnreadable {
				out = append(out, t[i:j+n]...)
				fields++
			}
			i = j + n
			continue
		}
		// A table or array whose length is known: its content as bytes.
		if (t[j] == 'F' || t[j] == 'A') && j+5 <= len(t) {
			l := int64(binary.BigEndian.Uint32(t[j+1 : j+5]))
			if int64(j+5)+l <= int64(len(t)) {
				reason = firstOf(reason, why)
				names = append(names, string(key))
				out = appendBytesEntry(out, key, t[j+5:j+5+int(l)], keep)
				fields++
				i = j + 5 + int(l)
				continue
			}
		}
		reason = firstOf(reason, why)
		break
	}
	if i < len(t) {
		names = append(names, HeaderUnreadableRest)
		if rest {
			out = appendBytesEntry(out, []byte(HeaderUnreadableRest), t[i:], keep)
		}
	}
	return out, names, reason
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// appendBytesEntry appends a table entry key = byte array v (empty unless
// keep).
func appendBytesEntry(dst, key, v []byte, keep bool) []byte {
	if !keep {
		v = nil
	}
	dst = append(dst, byte(len(key)))
	dst = append(dst, key...)
	dst = append(dst, 'x')
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

// appendMarker appends the entry HeaderUnreadable = names as a JSON array.
func appendMarker(dst []byte, names []string) []byte {
	v, _ := json.Marshal(names) // strings only: cannot fail
	dst = append(dst, byte(len(HeaderUnreadable)))
	dst = append(dst, HeaderUnreadable...)
	dst = append(dst, 'S')
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

// messageIDOf returns the message-id property of the content header payload
// p whose header table starts at off, or "".
func messageIDOf(p []byte, flags uint16, off int) string {
	if off+4 > len(p) {
		return ""
	}
	off += 4 + int(binary.BigEndian.Uint32(p[off:off+4]))
	for _, fl := range []uint16{flagDeliveryMode, flagPriority, flagCorrelationID, flagReplyTo, flagExpiration} {
		if flags&fl == 0 {
			continue
		}
		switch {
		case off >= len(p):
			return ""
		case fl == flagDeliveryMode || fl == flagPriority:
			off++
		default:
			off += 1 + int(p[off])
		}
	}
	if flags&flagMessageID == 0 || off >= len(p) || off+1+int(p[off]) > len(p) {
		return ""
	}
	return string(p[off+1 : off+1+int(p[off])])
}

// checkTable checks that the encoded table t (its entries, without the
// length) reads with amqp091-go at nesting depth depth, as readTableDepth
// reads it, and returns the number of entries, or why not. It is stricter
// than amqp091-go in one way: it counts repeated keys, which amqp091-go
// collapses.
func checkTable(t []byte, depth int) (int, string) {
	if depth > maxFieldDepth {
		return 0, "a table nested deeper than 32 levels"
	}
	fields := 0
	for i := 0; i < len(t); {
		j := i + 1 + int(t[i])
		if j > len(t) {
			return fields, "a malformed entry"
		}
		n, why := checkField(t[j:], depth)
		if why != "" {
			return fields, why
		}
		if fields++; fields > maxTableFields {
			return fields, "more than 8192 entries in a table"
		}
		i = j + n
	}
	return fields, ""
}

// fieldSizes are the sizes of the fixed-size field values by type.
var fieldSizes = [256]int8{
	't': 1, 'b': 1, 'B': 1, 's': 2, 'u': 2, 'I': 4, 'i': 4, 'f': 4,
	'l': 8, 'd': 8, 'T': 8, 'D': 5, 'V': 0,
}

// checkField checks that the field value (type octet and value) at the
// start of b reads with amqp091-go at depth depth, as readFieldDepth reads
// it, and returns its encoded length, or why not.
func checkField(b []byte, depth int) (int, string) {
	if len(b) == 0 {
		return 0, "a malformed entry"
	}
	typ := b[0]
	switch typ {
	case 'S', 'x', 'F', 'A':
		if len(b) < 5 {
			return 0, "a malformed entry"
		}
		l := binary.BigEndian.Uint32(b[1:5])
		if l > math.MaxInt32 || int64(l) > int64(len(b)-5) {
			return 0, "a malformed entry"
		}
		v := b[5 : 5+int(l)]
		switch typ {
		case 'F':
			if _, why := checkTable(v, depth+1); why != "" {
				return 0, why
			}
		case 'A':
			if why := checkArray(v, depth+1); why != "" {
				return 0, why
			}
		}
		return 5 + int(l), ""
	case 'V':
		return 1, ""
	}
	n := int(fieldSizes[typ])
	if n == 0 {
		return 0, "a field of unknown type"
	}
	if len(b) < 1+n {
		return 0, "a malformed entry"
	}
	return 1 + n, ""
}

// checkArray checks the encoded array a (its values, without the length)
// at depth depth, as readArrayDepth reads it.
func checkArray(a []byte, depth int) string {
	if depth > maxFieldDepth {
		return "an array nested deeper than 32 levels"
	}
	for i, n := 0, 0; i < len(a); n++ {
		if n >= maxTableFields {
			return "more than 8192 entries in an array"
		}
		l, why := checkField(a[i:], depth)
		if why != "" {
			return why
		}
		i += l
	}
	return ""
}
