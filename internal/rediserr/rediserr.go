// Package rediserr holds the texts of the error replies Redis 7.0 gives
// (server.c, networking.c, cluster.c, t_string.c), for the replies the
// proxy makes itself where Redis would have answered: the same words, so
// that clients and their tests cannot tell. A text starts with its error
// code and has no "-" or CRLF; redcon.AppendError frames it. Malformed
// requests are resp's ProtocolError values.
package rediserr

const (
	NoAuth      = "NOAUTH Authentication required."
	WrongPass   = "WRONGPASS invalid username-password pair or user is disabled."
	NoPassword  = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
	HelloNoAuth = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"
	NoProto     = "NOPROTO unsupported protocol version"
	BadProtover = "ERR Protocol version is not an integer or out of range"
	MaxClients  = "ERR max number of clients reached"
	QueryBuffer = "ERR max query buffer length reached, closing connection"

	Syntax       = "ERR syntax error"
	NotInteger   = "ERR value is not an integer or out of range"
	IntRange     = "ERR value is out of range, value must between -2147483648 and 2147483647"
	DecrOverflow = "ERR decrement would overflow"
	BadName      = "ERR Client names cannot contain spaces, newlines or special characters."
	DBRange      = "ERR DB index is out of range"
	WatchInMulti = "ERR WATCH inside MULTI is not allowed"
	ExecAbort    = "EXECABORT Transaction discarded because of previous errors."
	NoScript     = "NOSCRIPT No matching script. Please use EVAL."

	// Redis Cluster's, and what a standalone server says to cluster
	// commands.
	CrossSlot     = "CROSSSLOT Keys in request don't hash to the same slot"
	SlotNotServed = "CLUSTERDOWN Hash slot not served"
	SelectCluster = "ERR SELECT is not allowed in cluster mode"
	ClusterOff    = "ERR This instance has cluster support disabled"
)

// WrongArity is the reply to a command with the wrong number of arguments;
// name is lower case, "command|subcommand" for a subcommand.
func WrongArity(name string) string {
	return "ERR wrong number of arguments for '" + name + "' command"
}

// UnknownSubcommand is the reply to an unknown subcommand sub of command
// (upper case, as HELP is named).
func UnknownSubcommand(sub, command string) string {
	return "ERR unknown subcommand '" + sub + "'. Try " + command + " HELP."
}

// HelloOption is the reply to HELLO with an option it does not know.
func HelloOption(opt string) string {
	return "ERR Syntax error in HELLO option '" + opt + "'"
}

// Subscribed is the reply to a command a subscribed RESP2 client may not
// send; name as the client sent it.
func Subscribed(name string) string {
	return "ERR Can't execute '" + name + "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
}
