package rabbitmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeBroker speaks just enough AMQP 0-9-1 on one side of a net.Pipe for
// amqp091-go, on the other, to open a connection and channels, publish
// (the frames it writes are kept) and basic.get (answered with a content
// header payload the test gives, written as is). It makes amqp091-go's own
// writer and reader the oracle of the unit tests of the frame size and the
// frame filter, without a broker.
type fakeBroker struct {
	t        testing.TB
	conn     net.Conn
	frameMax uint32
	sent     chan rawFrame // content header frames the client sent
	get      chan []byte   // the content header payload of the next basic.get-ok
}

type rawFrame struct {
	typ     byte
	channel uint16
	payload []byte
}

// startFakeBroker returns a client connection (amqp091-go) to a fake
// broker that tunes frame_max to frameMax; wrap, when not nil, wraps the
// client's side of the pipe (the frame filter).
func startFakeBroker(t testing.TB, frameMax uint32, wrap func(net.Conn) net.Conn) (*amqp.Connection, *fakeBroker) {
	t.Helper()
	server, client := net.Pipe()
	b := &fakeBroker{t: t, conn: server, frameMax: frameMax, sent: make(chan rawFrame, 16), get: make(chan []byte, 1)}
	go b.serve()
	var c net.Conn = client
	if wrap != nil {
		c = wrap(client)
	}
	ac, err := amqp.Open(c, amqp.Config{
		SASL:      []amqp.Authentication{&amqp.PlainAuth{Username: "guest", Password: "guest"}},
		Vhost:     "/",
		FrameSize: int(frameMax),
	})
	if err != nil {
		t.Fatalf("open a connection to the fake broker: %v", err)
	}
	t.Cleanup(func() {
		ac.Close()
		server.Close()
	})
	return ac, b
}

func (b *fakeBroker) serve() {
	defer b.conn.Close()
	proto := make([]byte, 8)
	if _, err := io.ReadFull(b.conn, proto); err != nil {
		return
	}
	// connection.start: version 0-9, no server properties, PLAIN, en_US.
	b.method(0, 10, 10, []byte{0, 9}, u32(0), longstr("PLAIN"), longstr("en_US"))
	for {
		f, err := b.read()
		if err != nil {
			return
		}
		if f.typ != frameMethod {
			if f.typ == frameHeader {
				b.sent <- f
			}
			continue
		}
		class, method := binary.BigEndian.Uint16(f.payload), binary.BigEndian.Uint16(f.payload[2:])
		switch {
		case class == 10 && method == 11: // start-ok: tune
			b.method(0, 10, 30, u16(0), u32(b.frameMax), u16(0))
		case class == 10 && method == 40: // open: open-ok
			b.method(0, 10, 41, shortstr(""))
		case class == 10 && method == 50: // close: close-ok
			b.method(0, 10, 51)
			return
		case class == 20 && method == 10: // channel.open: open-ok
			b.method(f.channel, 20, 11, u32(0))
		case class == 20 && method == 40: // channel.close: close-ok
			b.method(f.channel, 20, 41)
		case class == 85 && method == 10: // confirm.select: select-ok
			b.method(f.channel, 85, 11)
		case class == 60 && method == 70: // basic.get: get-ok and the content
			hdr := <-b.get
			b.method(f.channel, 60, 71, u64(1), []byte{0}, shortstr(""), shortstr("q"), u32(0))
			b.write(frameHeader, f.channel, hdr)
			b.write(3, f.channel, []byte("body"))
		}
	}
}

func (b *fakeBroker) read() (rawFrame, error) {
	var h [7]byte
	if _, err := io.ReadFull(b.conn, h[:]); err != nil {
		return rawFrame{}, err
	}
	p := make([]byte, binary.BigEndian.Uint32(h[3:])+1)
	if _, err := io.ReadFull(b.conn, p); err != nil {
		return rawFrame{}, err
	}
	if p[len(p)-1] != frameEndOctet {
		return rawFrame{}, errors.New("fake broker: no frame-end")
	}
	return rawFrame{typ: h[0], channel: binary.BigEndian.Uint16(h[1:]), payload: p[:len(p)-1]}, nil
}

func (b *fakeBroker) method(channel, class, method uint16, args ...[]byte) {
	p := append(u16(class), u16(method)...)
	b.write(frameMethod, channel, append(p, bytes.Join(args, nil)...))
}

func (b *fakeBroker) write(typ byte, channel uint16, payload []byte) {
	f := []byte{typ}
	f = append(f, u16(channel)...)
	f = append(f, u32(uint32(len(payload)))...)
	f = append(f, payload...)
	f = append(f, frameEndOctet)
	_ = b.conn.SetWriteDeadline(time.Now().Add(testTimeout))
	if _, err := b.conn.Write(f); err != nil {
		return // the client closed: its test says why
	}
}

// headerSent publishes p on c and returns the content header frame
// amqp091-go wrote for it, frame overhead included.
func (b *fakeBroker) headerSent(c *amqp.Connection, p amqp.Publishing) ([]byte, error) {
	ch, err := c.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := ch.Publish("", "q", false, false, p); err != nil {
		return nil, err
	}
	select {
	case f := <-b.sent:
		out := append([]byte{f.typ}, u16(f.channel)...)
		out = append(out, u32(uint32(len(f.payload)))...)
		out = append(out, f.payload...)
		return append(out, frameEndOctet), nil
	case <-time.After(testTimeout):
		return nil, errors.New("fake broker: no content header")
	}
}

// delivered answers a basic.get on c with the content header payload hdr
// and returns what amqp091-go read of it.
func (b *fakeBroker) delivered(c *amqp.Connection, hdr []byte) (amqp.Delivery, error) {
	ch, err := c.Channel()
	if err != nil {
		return amqp.Delivery{}, err
	}
	defer ch.Close()
	b.get <- hdr
	d, ok, err := ch.Get("q", true)
	if err == nil && !ok {
		err = errors.New("fake broker: get-empty")
	}
	return d, err
}

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
func shortstr(s string) []byte {
	return append([]byte{byte(len(s))}, s...)
}
func longstr(s string) []byte { return append(u32(uint32(len(s))), s...) }
