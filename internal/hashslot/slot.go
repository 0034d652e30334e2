package hashslot

import "bytes"

// Count is the number of hash slots in a Redis Cluster.
const Count = 16384

// crcTable holds CRC16-XMODEM of every byte value, so Slot handles a byte
// per table lookup instead of eight shifts.
var crcTable = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return crc
}

// Slot returns the hash slot of key, in [0, Count).
func Of(key []byte) uint16 {
	return crc16(Tag(key)) % Count
}

// HashTag returns the part of key that Slot hashes: the bytes between the
// first '{' and the first '}' after it, or the whole key when there is no
// such pair or nothing between them. So "{user1}.a" and "{user1}.b" share a
// slot, "{}{a}x" hashes whole, "foo{{bar}}" hashes "{bar". The result
// aliases key.
func Tag(key []byte) []byte {
	open := bytes.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	n := bytes.IndexByte(key[open+1:], '}')
	if n <= 0 {
		return key
	}
	return key[open+1 : open+1+n]
}
