module tsgate.test/chunkdecode

go 1.24.9

require (
	github.com/gogo/protobuf v1.3.2
	github.com/golang/snappy v1.0.0
	github.com/prometheus/prometheus v0.309.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/grafana/regexp v0.0.0-20250905093917-f7b3be9d1853 // indirect
	github.com/kr/pretty v0.3.1 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.67.4 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	golang.org/x/text v0.32.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
