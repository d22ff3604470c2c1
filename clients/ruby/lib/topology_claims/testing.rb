# frozen_string_literal: true

require "open3"
require "timeout"

module TopologyClaims
  # Test helpers: the real `topology-claims serve` as a child process (require
  # "topology_claims/testing"). For tests that need no server, TopologyClaims.disable!.
  module Testing
    BIN_ENV = "TOPOLOGY_CLAIMS_BIN"

    # The binary: $TOPOLOGY_CLAIMS_BIN, else `topology-claims` on the PATH.
    def self.binary
      path = ENV[BIN_ENV] || "topology-claims"
      return path if path.include?("/") ? File.executable?(path) : system("command -v #{path} >/dev/null 2>&1")

      raise Error, "#{path} is not an executable topology-claims binary: put topology-claims on the PATH, or set " \
                   "#{BIN_ENV} to the binary (cargo build --release puts it in target/release)" unless ENV[BIN_ENV]

      raise Error, "#{BIN_ENV}=#{path} is not an executable topology-claims binary (build it with cargo build)"
    end

    # The environment without the caller's TOPOLOGY_CLAIMS_* settings (each knob has an env
    # var, so a developer's shell must not change what a test runs).
    def self.clean_env
      ENV.keys.grep(/\ATOPOLOGY_CLAIMS_/).to_h { |k| [k, nil] }
    end

    # Runs `topology-claims ARGS` to completion: [stdout, stderr, Process::Status].
    def self.run(*args, binary: self.binary, timeout: 60)
      Timeout.timeout(timeout) { Open3.capture3(clean_env, binary, *args.map(&:to_s)) }
    end

    # Pre-claims `value` in `namespace` as cell `cell_id`, committed, through the server of
    # `config` (default: the process-wide configuration): for a spec whose name must already be
    # taken by another cell. The claim's owner and source record are `owner_type` /
    # `owner_value` and `source_table` / `record_id`.
    def self.claim_as(cell_id, namespace:, value:, config: TopologyClaims.configuration,
                      owner_type: "user", owner_value: value, source_table: "users", record_id: 0)
      client = TopologyClaims::Client.new(config.dup_with(cell_id: cell_id))
      record = { namespace: namespace.to_s, claim_value: value.to_s,
                 **Names.owner_fields(owner_type),
                 owner_value: owner_value.to_s,
                 **Names.table_fields(source_table),
                 table_record_id: record_id.to_i }
      client.commit_update(client.begin_update(creates: [record]).lease_payload.lease_id)
      nil
    end

    # The cell that holds `value` in `namespace` (any form of it) and the claim's state
    # (:active, :creating, …), or nil when nobody does.
    def self.holder(namespace, value, config: TopologyClaims.configuration)
      Committer.instance.drain # this process's saves commit in the background: see them done
      answer = TopologyClaims.client(config).lookup_claim(namespace, value)
      [answer.cell_id, Names.short(answer.state).to_sym]
    rescue ClaimNotFound
      nil
    end

    # `assert_claimed` / `refute_claimed` for Minitest (include in a test case):
    #   assert_claimed "usernames", "alice"                   # by this process's cell
    #   assert_claimed "usernames", "bob", cell_id: "cell-b"
    module Assertions
      def assert_claimed(namespace, value, cell_id: nil, config: TopologyClaims.configuration)
        holder = Testing.holder(namespace, value, config: config)
        expected = cell_id || config.cell_id
        assert(holder == [expected, :active],
               "expected #{namespace} #{value.inspect} claimed by #{expected}, found #{holder.inspect}")
      end

      def refute_claimed(namespace, value, config: TopologyClaims.configuration)
        holder = Testing.holder(namespace, value, config: config)
        assert(holder.nil?, "expected #{namespace} #{value.inspect} unclaimed, held by #{holder.inspect}")
      end
    end

    # A running `topology-claims serve` (memory store, a free loopback port by default).
    class Server
      attr_reader :address, :pid

      # `args`: further serve flags (e.g. the --tls-* ones).
      def self.start(*args, binary: Testing.binary, store: "memory:")
        new(binary, ["serve", "--listen", "127.0.0.1:0", "--store", store, *args])
      end

      def initialize(binary, argv)
        @stdout_r, stdout_w = IO.pipe
        @log = Tempfile.create("topology-claims-serve")
        @pid = Process.spawn(Testing.clean_env.merge("RUST_LOG" => ENV.fetch("RUST_LOG", "warn")),
                             binary, *argv, out: stdout_w, err: @log, in: File::NULL)
        stdout_w.close
        line = Timeout.timeout(60) { @stdout_r.gets }
        match = /\Alistening on (\S+)/.match(line.to_s)
        unless match
          stop
          raise Error, "topology-claims serve did not announce `listening on HOST:PORT` (printed #{line.inspect}): #{File.read(@log.path)}"
        end
        @address = match[1]
      end

      # http://HOST:PORT, for the sidecars' --server.
      def url(scheme = "http") = "#{scheme}://#{address}"

      def port = address.split(":").last.to_i

      # SIGTERM, then waits (SIGKILL after `patience` seconds).
      def stop(patience: 10)
        return unless @pid

        Process.kill(:TERM, @pid)
        begin
          Timeout.timeout(patience) { Process.wait(@pid) }
        rescue Timeout::Error
          Process.kill(:KILL, @pid)
          Process.wait(@pid)
        end
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      ensure
        @pid = nil
        @stdout_r&.close unless @stdout_r&.closed?
      end
    end
  end
end

require "tempfile"
