#!/usr/bin/env python3
"""A small gRPC client for deploy/test.sh, talking to a server in a container from the host.

  health  --service NAME                  prints the grpc.health.v1 status (SERVING, …)
  begin-commit --cell-id C --email VALUE  BeginUpdate creating the email claim, then CommitUpdate

The ClaimsService stubs are generated from proto/ at run time with grpc_tools.protoc (offline),
so they always match the server's contract. TLS: --ca, and --cert/--key for mutual TLS; without
--ca the channel is plaintext. Exit status 0 on success, 1 with the reason on stderr otherwise.
"""

import argparse
import atexit
import importlib
import os
import shutil
import sys
import tempfile
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_tools import protoc

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def claims_stubs():
    """Generates and imports topology/claims/v1/claims_pb2{,_grpc} from proto/."""
    out = tempfile.mkdtemp(prefix="topology-claims-stubs.")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main([
        "protoc", f"-I{os.path.join(REPO, 'proto')}", f"-I{include}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        "topology/claims/v1/claims.proto",
    ])
    if rc != 0:
        sys.exit(f"grpc_probe: protoc failed on proto/topology/claims/v1/claims.proto (status {rc})")
    sys.path.insert(0, out)
    return (importlib.import_module("topology.claims.v1.claims_pb2"),
            importlib.import_module("topology.claims.v1.claims_pb2_grpc"))


def channel(args):
    if not args.ca:
        return grpc.insecure_channel(args.target)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(args.ca),
        private_key=read(args.key) if args.key else None,
        certificate_chain=read(args.cert) if args.cert else None,
    )
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    return grpc.secure_channel(args.target, credentials, options=options)


def health(args):
    stub = health_pb2_grpc.HealthStub(channel(args))
    response = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


def begin_commit(args):
    pb, pb_grpc = claims_stubs()
    stub = pb_grpc.ClaimsServiceStub(channel(args))
    lease_id = str(uuid.uuid4())
    claim = pb.ClaimRecord(
        claim_type=pb.ClaimRecord.CLAIM_TYPE_EMAIL, claim_value=args.email,
        owner=pb.ClaimRecord.OWNER_USER, owner_value="1",
        table_name=pb.ClaimRecord.TABLE_NAME_EMAILS, table_record_id=1,
    )
    begun = stub.BeginUpdate(pb.BeginUpdateRequest(
        cell_id=args.cell_id, creates_claims=[claim], lease_id=lease_id), timeout=args.timeout)
    if begun.lease_payload.lease_id != lease_id:
        print(f"BeginUpdate answered lease {begun.lease_payload.lease_id!r}, sent {lease_id!r}",
              file=sys.stderr)
        return 1
    stub.CommitUpdate(pb.CommitUpdateRequest(cell_id=args.cell_id, lease_id=lease_id),
                      timeout=args.timeout)
    print(f"committed lease {lease_id} creating email {args.email} for {args.cell_id}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HOST:PORT of the gRPC server")
    parser.add_argument("--ca", help="CA bundle the server certificate chains to (TLS)")
    parser.add_argument("--cert", help="client certificate (mutual TLS)")
    parser.add_argument("--key", help="client key (mutual TLS)")
    parser.add_argument("--server-name", help="verify the server certificate for this name")
    parser.add_argument("--timeout", type=float, default=10.0, help="per call, seconds (default 10)")
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser("health")
    h.add_argument("--service", default="", help='health service name (default "": the server)')
    bc = sub.add_parser("begin-commit")
    bc.add_argument("--cell-id", required=True)
    bc.add_argument("--email", required=True)
    args = parser.parse_args()
    try:
        return {"health": health, "begin-commit": begin_commit}[args.command](args)
    except grpc.RpcError as e:
        print(f"grpc_probe {args.command} against {args.target}: {e.code().name}: {e.details()}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
