package rocketmq

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The remoting frame: a 4-byte big-endian length of what follows, a 4-byte
// word whose top byte is the header's serialization type and whose low 24
// bits are the header's length, the header, then the body.
const (
	// MaxFrame bounds a whole frame: a 4 MiB message, or a batch of them,
	// with room for its header.
	MaxFrame = 8 << 20
	// MaxHeader bounds the JSON header.
	MaxHeader = 64 << 10

	serialJSON = 0

	flagResponse = 1 << 0
	flagOneway   = 1 << 1
)

// ErrFrame is a frame that cannot be read: its connection is closed.
var ErrFrame = errors.New("rocketmq: bad frame")

// command is one remoting request or response.
type command struct {
	Code      int16             `json:"code"`
	Language  string            `json:"language"`
	Version   int16             `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int32             `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
	Body      []byte            `json:"-"`
}

func (c *command) oneway() bool   { return c.Flag&flagOneway != 0 }
func (c *command) response() bool { return c.Flag&flagResponse != 0 }

// field is an extFields value, "" when absent.
func (c *command) field(names ...string) string {
	for _, n := range names {
		if v, ok := c.ExtFields[n]; ok {
			return v
		}
	}
	return ""
}

// intField is an integer extFields value under the first of names present;
// an absent one is def, a malformed one an error naming it.
func (c *command) intField(def int64, names ...string) (int64, error) {
	for _, n := range names {
		if v, ok := c.ExtFields[n]; ok {
			i, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("header field %s is %q, not an integer", n, v)
			}
			return i, nil
		}
	}
	return def, nil
}

// readFrame reads one frame's bytes after its length word.
func readFrame(r io.Reader) ([]byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(lb[:])
	if n < 4 || n > MaxFrame {
		return nil, fmt.Errorf("%w: length %d is outside 4..%d", ErrFrame, n, MaxFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// decode parses a frame's bytes (after the length word).
func decode(frame []byte) (*command, error) {
	if len(frame) < 4 {
		return nil, fmt.Errorf("%w: %d bytes, no header length", ErrFrame, len(frame))
	}
	word := binary.BigEndian.Uint32(frame)
	if t := byte(word >> 24); t != serialJSON {
		return nil, fmt.Errorf("%w: serialization type %d (only JSON, 0, is spoken)", ErrFrame, t)
	}
	hl := int(word & 0xFFFFFF)
	if hl > MaxHeader || hl > len(frame)-4 {
		return nil, fmt.Errorf("%w: header length %d in a frame of %d bytes (limit %d)", ErrFrame, hl, len(frame), MaxHeader)
	}
	c := &command{}
	if err := json.Unmarshal(frame[4:4+hl], c); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrFrame, err)
	}
	if body := frame[4+hl:]; len(body) > 0 {
		c.Body = body
	}
	return c, nil
}

// encode is the whole frame of c, length word included.
func encode(c *command) ([]byte, error) {
	h, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if len(h) > MaxHeader {
		return nil, fmt.Errorf("rocketmq: header of %d bytes is over %d", len(h), MaxHeader)
	}
	out := make([]byte, 8, 8+len(h)+len(c.Body))
	binary.BigEndian.PutUint32(out, uint32(4+len(h)+len(c.Body)))
	binary.BigEndian.PutUint32(out[4:], uint32(serialJSON)<<24|uint32(len(h)))
	out = append(out, h...)
	return append(out, c.Body...), nil
}
