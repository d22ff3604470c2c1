# frozen_string_literal: true

module TopologyClaims
  # Turns a GRPC::BadStatus into the gem's typed error, from the google.rpc.ErrorInfo the server
  # attaches to every status (docs/api.md, "Errors"). Decides nothing: the reason is the server's.
  module Status
    ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
    RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
    CLAIM_CONFLICTS = "type.googleapis.com/topology.claims.v1.ClaimConflicts"
    DOMAIN = "topology-claims"
    # Without ErrorInfo, these come from the transport (or a proxy): maybe applied, retryable.
    TRANSPORT_RETRYABLE = %w[UNAVAILABLE DEADLINE_EXCEEDED UNKNOWN CANCELLED RESOURCE_EXHAUSTED].freeze

    module_function

    def code_name(code)
      GRPC::Core::StatusCodes.constants.find { |c| GRPC::Core::StatusCodes.const_get(c) == code }.to_s
    end

    # `what` names the call and the server, e.g. "BeginUpdate to the claims server at HOST:PORT".
    def to_error(status, what)
      code = code_name(status.code)
      info, retry_after, conflicts = details(status)
      if info.nil? || info.domain != DOMAIN
        klass = TRANSPORT_RETRYABLE.include?(code) ? Unavailable : ServiceError
        return klass.new("#{what} failed: #{code}: #{status.details}", code: code)
      end
      metadata = info.metadata.to_h
      klass = REASONS.fetch(info.reason) { code == "UNAVAILABLE" ? Unavailable : ServiceError }
      klass.new("#{what} refused: #{status.details} (#{info.reason})",
                reason: info.reason, code: code, metadata: metadata, retry_after: retry_after,
                conflicts: conflicts)
    end

    def details(status)
      rpc = status.to_rpc_status
      return [nil, nil, []] unless rpc

      info = nil
      retry_after = nil
      conflicts = []
      rpc.details.each do |any|
        case any.type_url
        when ERROR_INFO then info = Google::Rpc::ErrorInfo.decode(any.value)
        when RETRY_INFO
          delay = Google::Rpc::RetryInfo.decode(any.value).retry_delay
          retry_after = delay.seconds + (delay.nanos / 1e9) if delay
        when CLAIM_CONFLICTS then conflicts = conflicts_of(any.value)
        end
      end
      [info, retry_after, conflicts]
    rescue Google::Protobuf::ParseError
      [nil, nil, []]
    end

    def conflicts_of(bytes)
      Topology::Claims::V1::ClaimConflicts.decode(bytes).conflicts.filter_map do |conflict|
        claim = conflict.claim
        next unless claim

        Conflict.new(reason: conflict.reason, namespace: claim.namespace, claim_value: claim.claim_value)
      end
    end
  end
end
