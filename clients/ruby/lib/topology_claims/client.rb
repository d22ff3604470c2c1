# frozen_string_literal: true

require "securerandom"

module TopologyClaims
  # The cell's client of topology.claims.v1.ClaimsService: typed errors from ErrorInfo, retries
  # of UNAVAILABLE / DEADLINE_EXCEEDED (and a per-cell limit's RATE_LIMITED, after at least its
  # RetryInfo delay) with jittered backoff, BeginUpdate retried under the same client-chosen
  # lease id (a retry returns the same lease), and the circuit breaker.
  #
  # Fork safety: the channel is made at the first call, in the process that makes it, never at
  # load time. Debian's grpc 1.51 has no fork support: a child of a process that has made a call
  # cannot make calls (they would hang), so such a child gets ForkedAfterCall at once.
  class Client
    BACKOFF_INITIAL = 0.05
    BACKOFF_MAX = 2.0
    MAX_RECEIVE_BYTES = 8 * 1024 * 1024

    attr_reader :config

    def initialize(config = TopologyClaims.configuration)
      @config = config
      @breaker = Breaker.new(config)
      @mutex = Mutex.new
      @stubs = {}
      @stub_pid = nil
    end

    # BeginUpdate. `creates`, `destroys`, `updates` are ClaimRecords (or hashes of their fields).
    # `deadline`: one overall deadline in seconds covering every attempt (the in-transaction
    # order); nil: each attempt has `timeout`, up to `max_attempts`.
    # `wait_for_leased`: seconds to wait for claims another lease holds (TopologyClaims.with_lease_wait);
    # each attempt, and `deadline`, get that much longer.
    def begin_update(creates: [], destroys: [], updates: [], lease_id: SecureRandom.uuid,
                     local_transaction: "", deadline: nil, wait_for_leased: nil)
      request = V1::BeginUpdateRequest.new(
        cell_id: config.cell_id, lease_id: lease_id, local_transaction: local_transaction.to_s,
        creates_claims: creates.map { |c| record(c) }, destroys_claims: destroys.map { |c| record(c) },
        updates_claims: updates.map { |c| record(c) }
      )
      wait = wait_for_leased.to_f
      if wait.positive?
        request.wait_for_leased = Google::Protobuf::Duration.new(seconds: wait.floor, nanos: ((wait % 1) * 1e9).round)
        deadline += wait if deadline
      end
      attempts = { lost: false }
      call(:begin_update, request, deadline: deadline, claims: creates.size + destroys.size + updates.size,
                                   attempts_seen: attempts, extra: wait)
    rescue CallError => e
      fence(lease_id, e) if attempts[:lost] && !e.is_a?(Unavailable)
      raise
    end

    def commit_update(lease_id)
      call(:commit_update, V1::CommitUpdateRequest.new(cell_id: config.cell_id, lease_id: lease_id))
    end

    # Unconditional unless `unrenewed_for` (seconds) is given (a reconciler's rollback).
    # `counted: false` for a clean-up after a failed call: its own failure is not another
    # strike for the breaker (one per save).
    def rollback_update(lease_id, unrenewed_for: nil, attempts: nil, counted: true)
      request = V1::RollbackUpdateRequest.new(cell_id: config.cell_id, lease_id: lease_id)
      if unrenewed_for
        request.unrenewed_for = Google::Protobuf::Duration.new(
          seconds: unrenewed_for.to_i, nanos: ((unrenewed_for % 1) * 1e9).to_i
        )
      end
      call(:rollback_update, request, attempts: attempts, counted: counted)
    end

    def renew_lease(lease_id)
      call(:renew_lease, V1::RenewLeaseRequest.new(cell_id: config.cell_id, lease_id: lease_id))
    end

    # The LookupClaimResponse of one claim: `namespace` ("usernames", …, or a legacy type:
    # :username, :email, :routes) and the value in any form with the claim's key.
    def lookup_claim(namespace, value)
      namespace = Names.namespace_of_type(namespace) if namespace.is_a?(Symbol)
      call(:lookup_claim, V1::LookupClaimRequest.new(namespace: namespace.to_s, claim_value: value.to_s))
    end

    # The namespaces the server holds (AdminV1::Namespace messages), in id order.
    def list_namespaces
      call(:list_namespaces, AdminV1::ListNamespacesRequest.new).namespaces.to_a
    end

    # Every outstanding lease of this cell (follows next_cursor to the last page).
    def outstanding_leases
      leases = []
      cursor = ""
      loop do
        page = call(:list_outstanding_leases,
                    V1::ListOutstandingLeasesRequest.new(cell_id: config.cell_id, cursor: cursor))
        leases.concat(page.leases.to_a)
        cursor = page.next_cursor
        return leases if cursor.empty?
      end
    end

    # Every claim of this cell in source table `table` (:users, :ssh_keys, …), following
    # next_page_token.
    def claims_of(table)
      claims = []
      token = ""
      fields = Names.table_fields(table)
      loop do
        page = call(:list_claims, V1::ListClaimsRequest.new(
          cell_id: config.cell_id, **fields, page_token: token, page_tokens: true
        ))
        claims.concat(page.claims.to_a)
        token = page.next_page_token
        return claims if token.empty?
      end
    end

    private

    def record(claim)
      claim.is_a?(V1::ClaimRecord) ? claim : V1::ClaimRecord.new(**claim)
    end

    RPC_NAMES = {
      begin_update: "BeginUpdate", commit_update: "CommitUpdate", rollback_update: "RollbackUpdate",
      renew_lease: "RenewLease", lookup_claim: "LookupClaim",
      list_outstanding_leases: "ListOutstandingLeases", list_claims: "ListClaims",
      list_namespaces: "ListNamespaces"
    }.freeze

    # The RPCs of topology.claims.admin.v1 a cell may call (the rest are topology.claims.v1).
    ADMIN_RPCS = %i[list_namespaces].freeze

    # `attempts_seen`: a hash whose :lost is set when an attempt's fate is unknown (no answer, a
    # broken connection, an unavailable store): that attempt may still be applied later.
    # `extra`: seconds each attempt may take beyond config.timeout (a BeginUpdate that waits).
    def call(method, request, deadline: nil, claims: 0, attempts: nil, attempts_seen: {}, counted: true, extra: 0)
      rpc = RPC_NAMES.fetch(method)
      what = "#{rpc} to the claims server at #{config.address}"
      stub = stub_for_this_process(ADMIN_RPCS.include?(method) ? :admin : :claims)
      started = monotonic
      attempt = 0
      max_attempts = attempts || config.max_attempts
      @breaker.admit(claims) do
        loop do
          attempt += 1
          per_attempt = config.timeout + extra
          if deadline
            remaining = deadline - (monotonic - started)
            per_attempt = [per_attempt, remaining].min
          end
          begin
            response = stub.public_send(method, request, deadline: Time.now + per_attempt)
            finished(rpc, "OK", attempt, started)
            @breaker.success if counted
            return response
          rescue GRPC::BadStatus => e
            error = Status.to_error(e, what)
            details = e.details
          end
          finished(rpc, error.code, attempt, started, error)
          raise error unless error.is_a?(Unavailable)

          attempts_seen[:lost] = true

          delay = backoff(attempt)
          delay = [delay, error.retry_after].max if error.retry_after
          out_of_time = deadline && (monotonic - started + delay) >= deadline
          if attempt >= max_attempts || out_of_time
            @breaker.failure if counted
            spent = (monotonic - started).round(3)
            raise error.class.new(
              "#{what}: no answer after #{attempt} attempt(s) in #{spent}s" \
              "#{deadline ? " (deadline #{deadline}s)" : ''}: #{error.code}: #{details}",
              reason: error.reason, code: error.code, metadata: error.metadata, retry_after: error.retry_after
            )
          end
          sleep delay
        end
      end
    end

    # An attempt of a BeginUpdate was lost and a later one refused: the lost one may still be
    # applied (queued in a server's group-commit combiner, or in a store transaction being
    # retried) and lease a claim this cell believes it never got. A RollbackUpdate of an unknown
    # lease is remembered as rolled back, so that attempt is refused if it lands, and rolled back
    # if it already has (decision 106). If the rollback fails too, the reconciler rolls it back.
    def fence(lease_id, refusal)
      rollback_update(lease_id, attempts: 1, counted: false)
    rescue Error => e
      TopologyClaims.logger.warn("topology_claims: could not fence lease #{lease_id} after #{refusal.class}: " \
                                 "#{e.message}; if its lost attempt lands, the reconciler rolls it back")
    end

    def finished(rpc, code, attempts, started, error = nil)
      TopologyClaims.metrics.increment(:calls, "#{rpc} #{code}")
      TopologyClaims.instrument("call", method: rpc, code: code, attempts: attempts,
                                        duration: monotonic - started, reason: error&.reason)
    end

    def backoff(attempt)
      base = [BACKOFF_INITIAL * (2**(attempt - 1)), BACKOFF_MAX].min
      base / 2 + rand * base / 2
    end

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # The stub of `service` (:claims, :admin) made in this process.
    def stub_for_this_process(service)
      pid = Process.pid
      stub = @stubs[service]
      return stub if stub && @stub_pid == pid

      TopologyClaims.check_fork!
      @mutex.synchronize do
        @stubs = {} unless @stub_pid == pid
        @stub_pid = pid
        @stubs[service] ||= begin
          config.validate!
          TopologyClaims.load_grpc
          TopologyClaims.note_grpc_use
          klass = service == :admin ? AdminV1::AdminService::Stub : V1::ClaimsService::Stub
          klass.new(config.target, credentials, channel_args: channel_args)
        end
      end
    end

    def credentials
      tls = config.tls
      return :this_channel_is_insecure unless tls

      read = lambda do |key|
        path = tls[key] or raise ConfigurationError, "tls[:#{key}] is not set"
        File.read(path)
      rescue Errno::ENOENT, Errno::EACCES => e
        raise ConfigurationError, "tls[:#{key}] #{path}: #{e.message}"
      end
      GRPC::Core::ChannelCredentials.new(read.call(:ca), tls[:key] && read.call(:key), tls[:cert] && read.call(:cert))
    end

    def channel_args
      args = { "grpc.max_receive_message_length" => MAX_RECEIVE_BYTES }
      server_name = config.tls && config.tls[:server_name]
      args["grpc.ssl_target_name_override"] = server_name if server_name
      args
    end
  end
end
