// Package brokerpb is the generated code of broker.proto, the contract of
// the vram node broker (package vram/broker). Do not edit the .pb.go
// files: change broker.proto and run `go generate ./broker/brokerpb`.
//
// Generating needs protoc from Debian's protobuf-compiler (3.21.12 in
// bookworm: `apt-get install protobuf-compiler`) and the two Go plugins,
// which are tool dependencies in go.mod, so their versions are pinned
// there and `go tool` builds them: google.golang.org/protobuf's
// protoc-gen-go (v1.36.12, the runtime's version) and
// google.golang.org/grpc/cmd/protoc-gen-go-grpc (v1.6.2). Debian's
// golang-goprotobuf-dev and protoc-gen-go-grpc packages are older (the
// v1.3 API) and are not used.
package brokerpb

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative broker.proto"
