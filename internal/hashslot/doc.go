// Package hashslot computes Redis Cluster hash slots as the Redis Cluster
// specification defines them: CRC16 (the XMODEM variant: polynomial 0x1021,
// initial value 0) of the key, modulo 16384, where a key with a hash tag
// hashes only the tag.
//
// The proxy's router uses Of to find the master that owns a key, and
// hot-key bucket placement uses it to choose bucket names that land on
// different masters. Both must agree with the servers byte for byte, so the
// tests compare every result with CLUSTER KEYSLOT of a real redis-server.
//
// Of and Tag do not allocate.
package hashslot
