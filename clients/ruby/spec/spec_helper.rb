# frozen_string_literal: true

# The gem's specs run against the real `topology-claims serve` ($TOPOLOGY_CLAIMS_BIN, default
# <repo>/target/debug/topology-claims), one server for the whole run (memory store), with cells
# whose local databases are SQLite files and PostgreSQL databases (tc_ruby_*, dropped and
# created here; PostgreSQL at 127.0.0.1:5432, user postgres: TC_RUBY_PGHOST/PGPORT/PGUSER).
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
ENV["TOPOLOGY_CLAIMS_BIN"] ||= File.expand_path("../../../target/debug/topology-claims", __dir__)

require "fileutils"
require "securerandom"
require "tmpdir"
require "logger"
require "topology_claims"
require "topology_claims/testing"
require "topology_claims/testing/rspec"
require_relative "support/cells"

ActiveRecord::Base.logger = Logger.new(ENV["TC_RUBY_AR_LOG"] ? $stderr : File::NULL)
TopologyClaims.configuration.logger = Logger.new(ENV["TC_RUBY_AR_LOG"] ? $stderr : File::NULL)

module SpecSupport
  ROOT = File.expand_path("..", __dir__)
  TMP = Dir.mktmpdir("topology-claims-ruby-specs")
  WORKER = File.expand_path("support/cell_worker.rb", __dir__)

  module_function

  # State lives on the module (SpecSupport.server…), never in an example's instance variables.
  def server
    SpecSupport.instance_eval { @server ||= TopologyClaims::Testing::Server.start }
  end

  def stop
    SpecSupport.instance_eval { @server }&.stop
    FileUtils.rm_rf(TMP)
  end

  def run_id = SpecSupport.instance_eval { @run_id ||= SecureRandom.hex(3) }

  # The cells of one adapter, built once per run: :a and :b.
  def cell(adapter, name)
    cells = SpecSupport.instance_eval { @cells ||= {} }
    cells[[adapter, name]] ||= begin
      database = adapter == :sqlite ? File.join(TMP, "cell-#{name}.sqlite3") : "tc_ruby_cell_#{name}"
      Cells.build(adapter: adapter, name: "#{adapter}-#{name}", cell_id: "rb-#{adapter}-#{name}-#{run_id}",
                  database: database, address: server.url)
    end
  end

  def unique(prefix) = "#{prefix}-#{SecureRandom.hex(5)}"

  # Runs spec/support/cell_worker.rb for `cell` with `env`; returns [stdout, status].
  def worker(cell, mode, env = {}, wait: true)
    r, w = IO.pipe
    pid = Process.spawn(TopologyClaims::Testing.clean_env.merge(cell.worker_env).merge("TC_MODE" => mode).merge(env),
                        RbConfig.ruby, WORKER, out: w, err: w, in: File::NULL)
    w.close
    return [pid, r] unless wait

    finish(pid, r)
  end

  def finish(pid, reader, patience: 60)
    output = nil
    status = nil
    Timeout.timeout(patience) do
      output = reader.read
      _, status = Process.wait2(pid)
    end
    reader.close
    [output, status]
  end

  # `topology-claims SUBCOMMAND` for `cell`: [stdout, stderr, status].
  def sidecar(cell, subcommand, *args)
    # This process's commits first: the sidecar is another process, and a claim still being
    # committed in the background is leased (CREATING), which a verifier leaves alone.
    TopologyClaims::Committer.instance.drain
    TopologyClaims::Testing.run(subcommand, "--server", SpecSupport.server.url, "--cell-id", cell.cell_id,
                                "--local-db", cell.local_db_url, *args)
  end

  # The names of the calls made while the block runs, e.g. ["BeginUpdate", "CommitUpdate"].
  def calls
    TopologyClaims::Committer.instance.drain # earlier saves' commits are not this block's
    names = []
    subscriber = ActiveSupport::Notifications.subscribe("call.topology_claims") do |*, payload|
      names << payload[:method]
    end
    yield
    TopologyClaims::Committer.instance.drain # CommitUpdate goes in the background
    names
  ensure
    ActiveSupport::Notifications.unsubscribe(subscriber)
  end

  # [cell id, state name] of a claim, or nil when the service does not have it.
  def lookup(cell, type, value)
    TopologyClaims::Committer.instance.drain # this process's commits first
    answer = cell.client.lookup_claim(type, value)
    [answer.cell_id, TopologyClaims::Names.short(answer.state)]
  rescue TopologyClaims::ServiceError, TopologyClaims::ClaimNotFound => e
    raise unless e.code == "NOT_FOUND"

    nil
  end
end

RSpec.configure do |config|
  config.include SpecSupport
  config.disable_monkey_patching!
  config.order = :defined
  config.after(:suite) { SpecSupport.stop }
end
