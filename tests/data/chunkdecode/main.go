// Command chunkdecode asks a remote read endpoint for STREAMED_XOR_CHUNKS and decodes every
// chunk of the answer with Prometheus's own tsdb/chunkenc, printing one JSON line a chunk.
// Floats are printed as the hex of their IEEE 754 bits so that a comparison is bit-exact.
//
// Usage: chunkdecode URL TENANT START_MS END_MS NAME
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"

	"github.com/gogo/protobuf/proto"
	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

type span struct {
	Offset int32  `json:"offset"`
	Length uint32 `json:"length"`
}

type sample struct {
	T             int64    `json:"t"`
	Value         string   `json:"value,omitempty"`
	Hint          string   `json:"hint,omitempty"`
	Schema        int32    `json:"schema"`
	ZeroThreshold string   `json:"zero_threshold,omitempty"`
	Count         string   `json:"count,omitempty"`
	ZeroCount     string   `json:"zero_count,omitempty"`
	Sum           string   `json:"sum,omitempty"`
	PositiveSpans []span   `json:"positive_spans"`
	NegativeSpans []span   `json:"negative_spans"`
	Positive      []string `json:"positive"`
	Negative      []string `json:"negative"`
	CustomValues  []string `json:"custom_values"`
}

type chunkOut struct {
	QueryIndex int64             `json:"query_index"`
	Labels     map[string]string `json:"labels"`
	Encoding   string            `json:"encoding"`
	MinTime    int64             `json:"min_time_ms"`
	MaxTime    int64             `json:"max_time_ms"`
	Header     string            `json:"header,omitempty"`
	Samples    []sample          `json:"samples"`
}

func bits(f float64) string { return fmt.Sprintf("%016x", math.Float64bits(f)) }

func floats(values []float64) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = bits(v)
	}
	return out
}

func ints(values []int64) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = strconv.FormatInt(v, 10)
	}
	return out
}

func spans(in []histogram.Span) []span {
	out := make([]span, len(in))
	for i, s := range in {
		out[i] = span{s.Offset, s.Length}
	}
	return out
}

func headerName(h chunkenc.CounterResetHeader) string {
	switch h {
	case chunkenc.CounterReset:
		return "CounterReset"
	case chunkenc.NotCounterReset:
		return "NotCounterReset"
	case chunkenc.GaugeType:
		return "GaugeType"
	default:
		return "UnknownCounterReset"
	}
}

func hintName(h histogram.CounterResetHint) string {
	return [...]string{"UnknownCounterReset", "CounterReset", "NotCounterReset", "GaugeType"}[h]
}

func decode(encoding chunkenc.Encoding, data []byte) (string, []sample, error) {
	chunk, err := chunkenc.FromData(encoding, data)
	if err != nil {
		return "", nil, err
	}
	header := ""
	switch c := chunk.(type) {
	case *chunkenc.HistogramChunk:
		header = headerName(c.GetCounterResetHeader())
	case *chunkenc.FloatHistogramChunk:
		header = headerName(c.GetCounterResetHeader())
	}
	var out []sample
	it := chunk.Iterator(nil)
	for {
		switch it.Next() {
		case chunkenc.ValNone:
			return header, out, it.Err()
		case chunkenc.ValFloat:
			t, v := it.At()
			out = append(out, sample{T: t, Value: bits(v)})
		case chunkenc.ValHistogram:
			t, h := it.AtHistogram(nil)
			out = append(out, sample{
				T: t, Hint: hintName(h.CounterResetHint), Schema: h.Schema, ZeroThreshold: bits(h.ZeroThreshold),
				Count: strconv.FormatUint(h.Count, 10), ZeroCount: strconv.FormatUint(h.ZeroCount, 10), Sum: bits(h.Sum),
				PositiveSpans: spans(h.PositiveSpans), NegativeSpans: spans(h.NegativeSpans),
				Positive: ints(h.PositiveBuckets), Negative: ints(h.NegativeBuckets), CustomValues: floats(h.CustomValues),
			})
		case chunkenc.ValFloatHistogram:
			t, h := it.AtFloatHistogram(nil)
			out = append(out, sample{
				T: t, Hint: hintName(h.CounterResetHint), Schema: h.Schema, ZeroThreshold: bits(h.ZeroThreshold),
				Count: bits(h.Count), ZeroCount: bits(h.ZeroCount), Sum: bits(h.Sum),
				PositiveSpans: spans(h.PositiveSpans), NegativeSpans: spans(h.NegativeSpans),
				Positive: floats(h.PositiveBuckets), Negative: floats(h.NegativeBuckets), CustomValues: floats(h.CustomValues),
			})
		}
	}
}

// frames splits a streamed answer: uvarint length, big-endian CRC-32C (Castagnoli), message.
func frames(body io.Reader, each func([]byte) error) error {
	reader := bufio.NewReader(body)
	table := crc32.MakeTable(crc32.Castagnoli)
	for {
		size, err := binary.ReadUvarint(reader)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var sum [4]byte
		if _, err := io.ReadFull(reader, sum[:]); err != nil {
			return err
		}
		message := make([]byte, size)
		if _, err := io.ReadFull(reader, message); err != nil {
			return err
		}
		if crc32.Checksum(message, table) != binary.BigEndian.Uint32(sum[:]) {
			return fmt.Errorf("frame checksum mismatch")
		}
		if err := each(message); err != nil {
			return err
		}
	}
}

func run(url, tenant string, start, end int64, name string) error {
	request := &prompb.ReadRequest{
		Queries: []*prompb.Query{{
			StartTimestampMs: start, EndTimestampMs: end,
			Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_EQ, Name: "__name__", Value: name}},
		}},
		AcceptedResponseTypes: []prompb.ReadRequest_ResponseType{prompb.ReadRequest_STREAMED_XOR_CHUNKS},
	}
	raw, err := proto.Marshal(request)
	if err != nil {
		return err
	}
	post, err := http.NewRequest("POST", url, bytes.NewReader(snappy.Encode(nil, raw)))
	if err != nil {
		return err
	}
	post.Header.Set("Content-Type", "application/x-protobuf")
	post.Header.Set("Content-Encoding", "snappy")
	post.Header.Set("X-Prometheus-Remote-Read-Version", "0.1.0")
	post.Header.Set("X-Scope-OrgID", tenant)
	answer, err := http.DefaultClient.Do(post)
	if err != nil {
		return err
	}
	defer answer.Body.Close()
	if answer.StatusCode != 200 {
		text, _ := io.ReadAll(answer.Body)
		return fmt.Errorf("status %d: %s", answer.StatusCode, text)
	}
	if kind := answer.Header.Get("Content-Type"); kind != "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse" {
		return fmt.Errorf("unexpected content type %q", kind)
	}
	out := json.NewEncoder(os.Stdout)
	return frames(answer.Body, func(message []byte) error {
		var response prompb.ChunkedReadResponse
		if err := proto.Unmarshal(message, &response); err != nil {
			return err
		}
		for _, series := range response.ChunkedSeries {
			labels := map[string]string{}
			for _, label := range series.Labels {
				labels[label.Name] = label.Value
			}
			for _, chunk := range series.Chunks {
				header, samples, err := decode(chunkenc.Encoding(chunk.Type), chunk.Data)
				if err != nil {
					return fmt.Errorf("chunk %s of %v: %w", chunk.Type, labels, err)
				}
				record := chunkOut{response.QueryIndex, labels, chunk.Type.String(), chunk.MinTimeMs, chunk.MaxTimeMs, header, samples}
				if err := out.Encode(record); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: chunkdecode URL TENANT START_MS END_MS NAME")
		os.Exit(2)
	}
	start, err1 := strconv.ParseInt(os.Args[3], 10, 64)
	end, err2 := strconv.ParseInt(os.Args[4], 10, 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "START_MS and END_MS must be integers")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], start, end, os.Args[5]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
