// Command check asks quotad for one decision with the stubs protoc generates
// from crates/quotad-proto/proto (build.sh generates them; none are checked
// in): `check -addr 127.0.0.1:50051 -policy login -key alice`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "quotad.example/check/internal/quotad/v1"
)

// codec marshals with google.golang.org/protobuf, the runtime the stubs are
// generated for. Debian's grpc-go (1.33) marshals with the older
// github.com/golang/protobuf 1.3 by default, which cannot encode these
// messages' oneofs (it panics); registered under "proto", this replaces it.
type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (codec) Unmarshal(data []byte, v interface{}) error {
	return proto.Unmarshal(data, v.(proto.Message))
}

func (codec) Name() string { return "proto" }

func init() { encoding.RegisterCodec(codec{}) }

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "quotad's gRPC address")
	policy := flag.String("policy", "login", "the policy's name")
	key := flag.String("key", "alice", "the key to check")
	cost := flag.Uint64("cost", 1, "units the request spends")
	deadline := flag.Duration("deadline", 250*time.Millisecond, "how long the call may take")
	flag.Parse()

	conn, err := grpc.Dial(*addr, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()
	response, err := pb.NewQuotaClient(conn).Check(ctx, &pb.CheckRequest{
		Key:    *key,
		Cost:   cost,
		Policy: &pb.CheckRequest_PolicyName{PolicyName: *policy},
	})
	if err != nil {
		// quotad names the field it refused first: "cost: must be at least 1".
		s := status.Convert(err)
		fmt.Fprintf(os.Stderr, "%s: %s\n", s.Code(), s.Message())
		if s.Code() == codes.Unavailable || s.Code() == codes.DeadlineExceeded {
			os.Exit(3) // the caller's failure policy decides
		}
		os.Exit(2)
	}
	d := response.GetDecision()
	fmt.Printf("allowed=%t limit=%d remaining=%d retry_after_ms=%d reset_after_ms=%d reason=%s\n",
		d.GetAllowed(), d.GetLimit(), d.GetRemaining(), d.GetRetryAfterMs(), d.GetResetAfterMs(), d.GetReason())
	if !d.GetAllowed() {
		os.Exit(1)
	}
}
