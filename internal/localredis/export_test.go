package localredis

// Internals the external tests use.
var (
	AppendCommand = appendCommand
	InfoField     = infoField
)

const (
	ClusterSlots = clusterSlots
	LogName      = logName
	MsgAddrInUse = msgAddrInUse
)

func (c *Cluster) Opts() ClusterOptions { return c.opts }

func (s *Server) Dir() string { return s.dir }
