package resp

// LowerName lower-cases a command name into buf without allocating; names
// longer than buf are no command's and come back empty.
func LowerName(b []byte, buf *[24]byte) []byte {
	if len(b) > len(buf) {
		return nil
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(b)]
}
