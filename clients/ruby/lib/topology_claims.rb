# frozen_string_literal: true

# topology-claims for Ruby cells: a typed client of topology.claims.v1.ClaimsService and, with
# ActiveRecord, the TopologyClaims::Claimable concern (declarative claims, one lease per
# outermost transaction, refusals as validation errors).
#
# Loading this file connects nowhere and starts no thread (grpc itself is loaded at the first
# call), so a preforking server can fork after loading the models.
require "google/protobuf"
require "google/protobuf/well_known_types"
require "google/rpc/error_details_pb"
require "google/rpc/status_pb"
require "topology/claims/v1/claims_pb"
require "topology/claims/admin/v1/admin_pb"

require "topology_claims/version"
require "topology_claims/errors"
require "topology_claims/configuration"
require "topology_claims/names"
require "topology_claims/status"
require "topology_claims/breaker"
require "topology_claims/metrics"
require "topology_claims/client"
require "topology_claims/local_tables"
require "topology_claims/committer"
require "topology_claims/verify_toml"

module TopologyClaims
  # The generated protocol classes (Topology::Claims::V1).
  V1 = ::Topology::Claims::V1
  # The administrative protocol's classes (Topology::Claims::Admin::V1): cells may call its
  # ListNamespaces and GetNamespace.
  AdminV1 = ::Topology::Claims::Admin::V1

  autoload :Claimable, "topology_claims/claimable"

  CLIENTS_LOCK = Mutex.new

  class << self
    # The process-wide default configuration (from the environment until configured).
    def configuration
      @configuration ||= Configuration.new
    end

    def configure
      yield configuration
      @clients = nil
      configuration
    end

    # Replaces the default configuration (tests).
    def configuration=(config)
      @configuration = config
      @clients = nil
    end

    # The client of `config` (default: the process-wide one); one per configuration object.
    def client(config = configuration)
      CLIENTS_LOCK.synchronize do
        (@clients ||= {}.compare_by_identity)[config] ||= Client.new(config)
      end
    end

    # The kill switch: with claims disabled, claimable models save without calling the service
    # (no lease, no leases_outstanding row). For tests and emergencies; the verifier repairs the
    # claims of whatever was saved meanwhile. Also TOPOLOGY_CLAIMS_ENABLED=false.
    def disable!
      @disabled = true
    end

    def enable!
      @disabled = false
    end

    # False after disable!, or when `config.enabled` is false (TOPOLOGY_CLAIMS_ENABLED=false).
    def enabled?(config = configuration)
      !@disabled && config.enabled
    end

    def metrics
      @metrics ||= Metrics.new
    end

    # Within the block, this thread's claims wait up to `seconds` for a claim another cell's
    # update holds for a moment (CLAIM_LEASED), in first-come order, instead of failing at once:
    # the server answers when the holder commits (CLAIM_TAKEN: a validation error) or rolls back
    # (the claim is yours), or CLAIM_LEASED once the wait is over. The server clamps the wait to
    # its --max-lease-wait (5 s by default).
    #
    # For background jobs only. A claim is taken just before the record's transaction commits,
    # with its row locks held: a wait holds them (and the request thread) for its whole length.
    # A form must answer at once; a job renaming 10,000 routes may wait.
    #
    #   TopologyClaims.with_lease_wait(2.0) { route.update!(path: new_path) }
    def with_lease_wait(seconds)
      raise ArgumentError, "with_lease_wait: seconds must be positive, got #{seconds.inspect}" unless seconds.to_f.positive?

      previous = Thread.current[:topology_claims_lease_wait]
      Thread.current[:topology_claims_lease_wait] = seconds.to_f
      yield
    ensure
      Thread.current[:topology_claims_lease_wait] = previous
    end

    # The wait of the innermost with_lease_wait on this thread (nil outside one).
    def lease_wait
      Thread.current[:topology_claims_lease_wait]
    end

    # The namespaces the server holds (ListNamespaces): AdminV1::Namespace messages with `id`,
    # `normalization` (:NORMALIZATION_PRECIS_USERNAME, …), `max_chars`, `pattern`, `reserved`,
    # `description`, `deprecated` and `version`. A cell's certificate may call it.
    def namespaces(config = configuration)
      client(config).list_namespaces
    end

    def logger
      configuration.logger || (defined?(::ActiveRecord::Base) && ::ActiveRecord::Base.logger) || default_logger
    end

    # ActiveSupport::Notifications `NAME.topology_claims`, when ActiveSupport is loaded.
    def instrument(name, payload = {}, &block)
      if defined?(::ActiveSupport::Notifications)
        ::ActiveSupport::Notifications.instrument("#{name}.topology_claims", payload, &block)
      elsif block
        yield payload
      end
    end

    # grpc (its C core) is loaded at the first call, never at boot.
    def load_grpc
      require "grpc"
      require "topology/claims/v1/claims_services_pb"
      require "topology/claims/admin/v1/admin_services_pb"
    end

    # Called when this process starts using grpc (its first channel).
    def note_grpc_use
      @grpc_pid ||= Process.pid
    end

    # Raises ForkedAfterCall in a child forked from a process that had used grpc.
    def check_fork!
      return if @grpc_pid.nil? || @grpc_pid == Process.pid

      raise ForkedAfterCall,
            "this process (pid #{Process.pid}) was forked from pid #{@grpc_pid} after that process had made " \
            "claims calls; Debian's grpc 1.51 has no fork support, so calls from this process would hang. " \
            "Make no claims call before forking (loading the models makes none), or exec the workers"
    end

    private

    def default_logger
      require "logger"
      @default_logger ||= Logger.new($stderr)
    end
  end
end

require "topology_claims/railtie" if defined?(::Rails::Railtie)
