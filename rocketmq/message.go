package rocketmq

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"net/netip"
	"sort"
	"strings"
)

// RocketMQ message properties this front end reads or writes.
const (
	propUniqKey        = "UNIQ_KEY"
	propTranMsg        = "TRAN_MSG"
	propProducerGroup  = "PGROUP"
	propTags           = "TAGS"
	propTransactionID  = "__transactionId__"
	propReconsumeTimes = "RECONSUME_TIME"

	// sysFlag bits of a message.
	sysCompressed   = 0x1
	sysTranPrepared = 0x1 << 2
	sysTranMask     = 0x3 << 2

	// The magic code of RocketMQ's stored-message format (MESSAGE_MAGIC_CODE).
	storedMagic = 0xAABBCCDD
)

// decodeProperties parses RocketMQ's properties string: name \001 value,
// pairs separated by \002.
func decodeProperties(s string) map[string]string {
	out := map[string]string{}
	for _, item := range strings.Split(s, "\002") {
		if name, value, ok := strings.Cut(item, "\001"); ok && name != "" {
			out[name] = value
		}
	}
	return out
}

// encodeProperties is the inverse of decodeProperties, in name order.
func encodeProperties(p map[string]string) string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(1)
		b.WriteString(p[n])
		b.WriteByte(2)
	}
	return b.String()
}

// batchItem is one message of a batch send.
type batchItem struct {
	flag  int32
	body  []byte
	props map[string]string
}

// decodeBatch parses the body of SEND_BATCH_MESSAGE: messages in the
// client's encoding (size, magic, body CRC, flag, body length, body,
// properties length, properties), one after the other.
func decodeBatch(b []byte) ([]batchItem, error) {
	var out []batchItem
	for len(b) > 0 {
		if len(b) < 20 {
			return nil, fmt.Errorf("batch: %d trailing bytes, short of a message header", len(b))
		}
		size := int(binary.BigEndian.Uint32(b))
		if size < 22 || size > len(b) {
			return nil, fmt.Errorf("batch: message of %d bytes in %d remaining", size, len(b))
		}
		m := b[:size]
		flag := int32(binary.BigEndian.Uint32(m[12:]))
		bl := int(binary.BigEndian.Uint32(m[16:]))
		if bl < 0 || 20+bl+2 > size {
			return nil, fmt.Errorf("batch: body of %d bytes in a message of %d", bl, size)
		}
		body := m[20 : 20+bl]
		pl := int(binary.BigEndian.Uint16(m[20+bl:]))
		if 22+bl+pl != size {
			return nil, fmt.Errorf("batch: properties of %d bytes do not end the message of %d", pl, size)
		}
		out = append(out, batchItem{flag: flag, body: body, props: decodeProperties(string(m[22+bl:]))})
		b = b[size:]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("batch: no message")
	}
	return out, nil
}

// inflate undoes the client's zlib compression of a large body.
func inflate(b []byte, limit int) ([]byte, error) {
	r, err := zlib.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("compressed body: %w", err)
	}
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("compressed body: %w", err)
	}
	if len(out) > limit {
		return nil, fmt.Errorf("compressed body inflates to over %d bytes", limit)
	}
	return out, nil
}

// offsetMsgID is RocketMQ's 32-hex-digit "offset message ID": the store
// host's IPv4 address and port, then the commit-log offset (here the
// message's txmq sequence). Clients parse it (UnmarshalMsgID) and send the
// offset back in END_TRANSACTION and CONSUMER_SEND_MSG_BACK.
func offsetMsgID(host netip.AddrPort, offset int64) string {
	var b [16]byte
	a4 := host.Addr().Unmap().As4()
	copy(b[:4], a4[:])
	binary.BigEndian.PutUint32(b[4:], uint32(host.Port()))
	binary.BigEndian.PutUint64(b[8:], uint64(offset))
	return strings.ToUpper(hex.EncodeToString(b[:]))
}

// stored is one message in RocketMQ's stored-message format, the body of a
// PULL_MESSAGE answer and of CHECK_TRANSACTION_STATE.
type stored struct {
	topic          string
	queueID        int32
	flag           int32
	queueOffset    int64
	commitOffset   int64
	sysFlag        int32
	bornAt, at     int64 // Unix milliseconds
	host           netip.AddrPort
	reconsumeTimes int32
	body           []byte
	props          map[string]string
}

// appendStored appends m in the stored-message format (IPv4 hosts).
func appendStored(out []byte, m *stored) []byte {
	props := encodeProperties(m.props)
	if len(props) > 0x7FFF {
		props = props[:0]
	}
	topic := m.topic
	if len(topic) > 127 {
		topic = topic[:127]
	}
	size := 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(m.body) + 1 + len(topic) + 2 + len(props)
	a4 := m.host.Addr().Unmap().As4()
	be := binary.BigEndian
	out = be.AppendUint32(out, uint32(size))
	out = be.AppendUint32(out, storedMagic)
	out = be.AppendUint32(out, crc32.ChecksumIEEE(m.body))
	out = be.AppendUint32(out, uint32(m.queueID))
	out = be.AppendUint32(out, uint32(m.flag))
	out = be.AppendUint64(out, uint64(m.queueOffset))
	out = be.AppendUint64(out, uint64(m.commitOffset))
	out = be.AppendUint32(out, uint32(m.sysFlag&^sysCompressed))
	out = be.AppendUint64(out, uint64(m.bornAt))
	out = append(out, a4[:]...)
	out = be.AppendUint32(out, uint32(m.host.Port()))
	out = be.AppendUint64(out, uint64(m.at))
	out = append(out, a4[:]...)
	out = be.AppendUint32(out, uint32(m.host.Port()))
	out = be.AppendUint32(out, uint32(m.reconsumeTimes))
	out = be.AppendUint64(out, 0)
	out = be.AppendUint32(out, uint32(len(m.body)))
	out = append(out, m.body...)
	out = append(out, byte(len(topic)))
	out = append(out, topic...)
	out = be.AppendUint16(out, uint16(len(props)))
	return append(out, props...)
}
