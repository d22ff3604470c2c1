# frozen_string_literal: true

module TopologyClaims
  # Base of every error the gem raises.
  class Error < StandardError; end

  # A setting is missing or malformed; the message names it.
  class ConfigurationError < Error; end

  # The service refused or failed a call. `reason` is the google.rpc.ErrorInfo reason the
  # server sent (nil when no ErrorInfo came, e.g. a transport failure), `code` the gRPC status
  # code name, `metadata` the ErrorInfo metadata.
  class CallError < Error
    attr_reader :reason, :code, :metadata, :retry_after, :conflicts

    def initialize(message = nil, reason: nil, code: nil, metadata: {}, retry_after: nil, conflicts: [])
      super(message)
      @reason = reason
      @code = code
      @metadata = metadata
      @retry_after = retry_after
      @conflicts = conflicts
    end
  end

  # One refused claim of a BeginUpdate (the server's ClaimConflicts status detail): `reason`
  # (CLAIM_TAKEN, CLAIM_LEASED, CLAIM_NOT_FOUND, NOT_CLAIM_OWNER), `namespace`, `claim_value` (as
  # the request sent it).
  Conflict = Struct.new(:reason, :namespace, :claim_value, keyword_init: true)

  # A refusal about one claim: `namespace` (e.g. "emails") and `claim_value` name it.
  # `conflicts` lists every refused claim of the batch (this one first), each a Conflict;
  # `omitted` counts those the server left out of the list (past its cap).
  class ClaimError < CallError
    # The claim's namespace (a server older than namespaces sends only the legacy claim type).
    def namespace = metadata["namespace"] || Names.namespace_of_type(metadata["claim_type"])
    # Legacy: the claim type's name ("email") for the built-in namespaces, nil for the others.
    def claim_type = metadata["claim_type"]
    def claim_value = metadata["claim_value"]

    # Every refused claim (a server without the detail: this one alone).
    def conflicts
      listed = super
      return listed unless listed.empty?

      [Conflict.new(reason: reason, namespace: namespace, claim_value: claim_value)]
    end
  end

  # CLAIM_TAKEN: another cell (or another record of this cell) holds the claim.
  class ClaimTaken < ClaimError; end
  # CLAIM_LEASED: the claim is under another update in progress; try again (retry_after).
  class ClaimLeased < ClaimError; end
  # CLAIM_NOT_FOUND: a destroy or update of a claim the service does not have.
  class ClaimNotFound < ClaimError; end
  # NOT_CLAIM_OWNER: a destroy or update of another cell's claim.
  class NotClaimOwner < ClaimError; end
  # BATCH_CONFLICT: the same claim twice in one BeginUpdate.
  class BatchConflict < ClaimError; end
  # RESTORE_QUARANTINE: the claims store was restored from a backup and the cells have not all
  # re-verified; a claim that does not exist may be one the restore lost, so it cannot be created
  # yet. Try again later (retry_after, usually minutes).
  class RestoreQuarantine < ClaimError; end

  # A refusal about one lease: `lease_id` names it.
  class LeaseError < CallError
    def lease_id = metadata["lease_id"]
  end

  # LEASE_ROLLED_BACK: the lease was rolled back (by this cell or its reconciler).
  class LeaseRolledBack < LeaseError; end
  class LeaseCommitted < LeaseError; end
  class LeaseNotFound < LeaseError; end
  class NotLeaseOwner < LeaseError; end
  class LeaseIdConflict < LeaseError; end
  class LeaseRenewed < LeaseError; end

  # INVALID_REQUEST: `field` names the request field.
  class InvalidRequest < CallError
    def field = metadata["field"]
  end

  # UNKNOWN_NAMESPACE: a claim names a namespace the service does not hold (a typo, or one not
  # created yet). `namespace` names it.
  class UnknownNamespace < InvalidRequest
    def namespace = metadata["namespace"]
  end

  # The caller may not do this (PERMISSION_DENIED, UNAUTHENTICATED, CELL_DECOMMISSIONED…).
  # INVALID_CLAIM_VALUE: a value its namespace's rules refuse (`field` names it in the request,
  # `rule` is normalization, max_chars, pattern or reserved).
  class InvalidClaimValue < InvalidRequest
    def namespace = metadata["namespace"]
    def rule = metadata["rule"]
  end

  class PermissionDenied < CallError; end

  # The service did not answer in time or could not be reached (after the retries), or a
  # per-cell limit kept refusing. Nothing was changed by the gem; show "try again later".
  class Unavailable < CallError; end

  # The client-side circuit breaker refused the call without sending it; `limit` names which
  # limit (max_in_flight, max_claims_per_second, breaker).
  class CircuitOpen < Unavailable
    attr_reader :limit

    def initialize(message, limit:)
      super(message, reason: "CIRCUIT_OPEN", code: "UNAVAILABLE")
      @limit = limit
    end
  end

  # Any other answer of the service (INTERNAL, MIGRATIONS_PENDING…).
  class ServiceError < CallError; end

  # This process was forked from one that had already made a call: Debian's grpc 1.51 has no
  # fork support, so such a child cannot make calls at all (they would hang).
  class ForkedAfterCall < Error; end

  # The staleness guard refused the local COMMIT: BeginUpdate was sent longer ago than
  # staleness - safety_margin, so the reconciler may already have rolled the lease back.
  class StaleLease < Error; end

  # ErrorInfo reason => error class.
  REASONS = {
    "CLAIM_TAKEN" => ClaimTaken, "CLAIM_LEASED" => ClaimLeased,
    "CLAIM_NOT_FOUND" => ClaimNotFound, "NOT_CLAIM_OWNER" => NotClaimOwner,
    "BATCH_CONFLICT" => BatchConflict, "RESTORE_QUARANTINE" => RestoreQuarantine,
    "LEASE_ROLLED_BACK" => LeaseRolledBack, "LEASE_COMMITTED" => LeaseCommitted,
    "LEASE_NOT_FOUND" => LeaseNotFound, "NOT_LEASE_OWNER" => NotLeaseOwner,
    "LEASE_ID_CONFLICT" => LeaseIdConflict, "LEASE_RENEWED" => LeaseRenewed,
    "INVALID_REQUEST" => InvalidRequest, "UNKNOWN_NAMESPACE" => UnknownNamespace,
    "INVALID_CLAIM_VALUE" => InvalidClaimValue,
    "STORE_UNAVAILABLE" => Unavailable, "AUDIT_UNAVAILABLE" => Unavailable,
    "RATE_LIMITED" => Unavailable,
    "UNAUTHENTICATED" => PermissionDenied, "CELL_DECOMMISSIONED" => PermissionDenied,
    "CELL_ID_MISMATCH" => PermissionDenied, "ROLE_NOT_ALLOWED" => PermissionDenied
  }.freeze
end
