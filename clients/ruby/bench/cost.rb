# frozen_string_literal: true

# What claims cost a save: sequential creates of a model with two claims (username, email)
# against the same creates of a model without claims, in one run, with a breakdown of the
# claimed save (BeginUpdate, CommitUpdate, the leases_outstanding row, the rest: the local
# work). On PostgreSQL the row travels with the transaction's BEGIN (decision 125): local_row is
# then that whole round trip, the BEGIN a plain save makes too included. The numbers the gem's
# README reports ("What a claim costs").
#
#   ruby clients/ruby/bench/cost.rb [--creates 150] [--rounds 3] [--adapter postgresql|sqlite]
#                                   [--store postgres://…|sqlite:|memory:] [--serve-flag=--FLAG=VALUE …]
#                                   [--variant-flag=--FLAG=VALUE …] [--variant-store URL]
#                                   [--without-commit] [--cpu]
#
# The server is `topology-claims serve` ($TOPOLOGY_CLAIMS_BIN, default target/release, else
# target/debug) on its own store: by default a fresh PostgreSQL database tc_ruby_bench_store,
# like the cell's (tc_ruby_bench_cell), at TC_RUBY_PGHOST/PGPORT/PGUSER (127.0.0.1:5432,
# postgres). Rounds alternate plain and claimed so that both see the same machine; each round
# reports its median per create, and the summary the median of the rounds' medians.
#
# --variant-flag starts a second server with those flags (after the --serve-flag ones) on a store
# of its own (…_b), and adds a model "variant" that claims through it: an A/B of a server setting
# in the same rounds (`--variant-flag=--worker-threads=1`); --variant-store gives that server
# another store (`--variant-store memory:`: the save's cost with a store that costs nothing, the
# floor of the ratio on this machine). --without-commit adds a model whose
# CommitUpdate is never sent: what the save would cost without the background commit beside it
# (its leases are left to expire; a measurement, not a mode of the gem). --cpu reports, per model,
# the CPU time per create of this Ruby process, of the servers and of every PostgreSQL process on
# the machine (from /proc, Linux only), its background commits included: where a save's time
# goes when the cores are shared; the Ruby process's share is also split by thread (the saves'
# main thread, the gem's commit thread, gRPC's and Ruby's other threads).
require "etc"
require "optparse"
require "securerandom"

ROOT = File.expand_path("../../..", __dir__)
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
ENV["TOPOLOGY_CLAIMS_BIN"] ||= %w[release debug].map { |p| File.join(ROOT, "target", p, "topology-claims") }
                                                .find { |p| File.executable?(p) }

options = { creates: 150, rounds: 3, adapter: :postgresql,
            store: "postgres://postgres@127.0.0.1:5432/tc_ruby_bench_store" }
OptionParser.new do |o|
  o.banner = "usage: ruby bench/cost.rb [options]"
  o.on("--creates N", Integer, "creates per round and model (default 150)") { |v| options[:creates] = v }
  o.on("--rounds N", Integer, "rounds per model (default 3)") { |v| options[:rounds] = v }
  o.on("--adapter NAME", %w[postgresql sqlite], "the cell's database (default postgresql)") do |v|
    options[:adapter] = v.to_sym
  end
  o.on("--store URL", "the server's store (default a fresh PostgreSQL database)") { |v| options[:store] = v }
  o.on("--serve-flag FLAG", "a flag for topology-claims serve (repeatable), e.g. --serve-flag=--group-commit=off") do |v|
    (options[:serve_flags] ||= []) << v
  end
  o.on("--variant-flag FLAG", "a flag for a second server, measured in the same rounds (repeatable)") do |v|
    (options[:variant_flags] ||= []) << v
  end
  o.on("--variant-store URL", "the variant server's store (default the store's, a database of its own)") do |v|
    options[:variant_store] = v
  end
  o.on("--without-commit", "also measure a model whose CommitUpdate is never sent") { options[:without_commit] = true }
  o.on("--cpu", "report the CPU per create of Ruby, the servers and PostgreSQL (Linux /proc)") { options[:cpu] = true }
end.parse!
if options[:variant_store] && !options[:variant_flags]
  options[:variant_flags] = [] # a variant server that differs only by its store
end
abort "cost.rb: --cpu reads /proc, which this system lacks" if options[:cpu] && !File.exist?("/proc/self/stat")

require "topology_claims"
require "topology_claims/testing"
require_relative "../spec/support/cells"
require "logger"
ActiveRecord::Base.logger = nil
TopologyClaims.configuration.logger = Logger.new($stderr, level: :warn)

# Time spent in each part of the claimed save, by part.
module Parts
  @spent = Hash.new(0.0)
  class << self
    attr_reader :spent

    def time(part)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      yield
    ensure
      @spent[part] += Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    end

    def reset = @spent.clear
  end
end

TopologyClaims::Client.prepend(Module.new do
  def begin_update(**kwargs) = Parts.time(:begin_update) { super }
  def commit_update(*args, **kwargs) = Parts.time(:commit_update) { super }
end)
# The --without-commit model's configuration: its CommitUpdates are dropped.
SKIPPED_COMMITS = []
TopologyClaims::Client.prepend(Module.new do
  def commit_update(*args, **kwargs)
    SKIPPED_COMMITS.any? { |c| c.equal?(config) } ? nil : super
  end
end)
TopologyClaims::LocalTables.singleton_class.prepend(Module.new do
  def record(*args) = Parts.time(:local_row) { super }
end)
TopologyClaims::Claimable # loads the concern (and its Collector)
TopologyClaims::Collector.prepend(Module.new do
  def before_committed! = Parts.time(:before_commit) { super }
  def begin_with_row = Parts.time(:local_row) { super }
  def committed!(**kwargs) = Parts.time(:after_commit) { super }
end)

def median(values)
  sorted = values.sort
  mid = sorted.size / 2
  sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
end

def ms(seconds) = format("%.2f ms", seconds * 1000)

# CPU seconds used so far by the processes `pick` accepts (given a pid and its command name),
# threads included, from /proc/PID/stat (utime + stime, in clock ticks).
def cpu_seconds(pick)
  tick = Etc.sysconf(Etc::SC_CLK_TCK).to_f
  Dir["/proc/[0-9]*/stat"].sum do |path|
    stat = begin
      File.read(path)
    rescue SystemCallError
      next 0.0 # the process ended meanwhile
    end
    pid = path.split("/")[2].to_i
    command = stat[/\((.*)\)/m, 1]
    next 0.0 unless pick.call(pid, command)

    stat_cpu_seconds(stat, tick)
  end
end

# utime + stime of one /proc stat line (fields 14 and 15, in clock ticks), in seconds.
def stat_cpu_seconds(stat, tick)
  fields = stat[(stat.rindex(")") + 2)..].split
  (fields[11].to_i + fields[12].to_i) / tick
end

# CPU seconds used so far by each thread of this process, in three groups: the main thread (the
# saves), the gem's commit thread (its background CommitUpdates; Ruby names it "topology_claims
# committer", which Linux cuts to 15 bytes) and every other thread (gRPC's and Ruby's own).
def thread_cpu_seconds
  tick = Etc.sysconf(Etc::SC_CLK_TCK).to_f
  Dir["/proc/self/task/[0-9]*/stat"].each_with_object(Hash.new(0.0)) do |path, used|
    stat = begin
      File.read(path)
    rescue SystemCallError
      next # the thread ended meanwhile
    end
    tid = path.split("/")[4].to_i
    group = if tid == Process.pid then "main"
            elsif stat[/\((.*)\)/m, 1] == "topology_claims" then "commit thread"
            else "other threads"
            end
    used[group] += stat_cpu_seconds(stat, tick)
  end
end

THREAD_GROUPS = ["main", "commit thread", "other threads"].freeze

# The store's PostgreSQL database (fresh for this run), or nil.
store_database = options[:store].start_with?("postgres") ? options[:store].split("/").last.split("?").first : nil
Cells.prepare_database(:postgresql, store_database) if store_database
server = TopologyClaims::Testing::Server.start(*options.fetch(:serve_flags, []), store: options[:store])
variant_server = nil
begin
  if options[:variant_flags]
    variant_store = options[:variant_store] || options[:store]
    if store_database && !options[:variant_store]
      variant_store = variant_store.sub("/#{store_database}", "/#{store_database}_b")
      Cells.prepare_database(:postgresql, "#{store_database}_b")
    end
    variant_server = TopologyClaims::Testing::Server.start(*options.fetch(:serve_flags, []), *options[:variant_flags],
                                                           store: variant_store)
  end
  database = options[:adapter] == :sqlite ? File.join(Dir.tmpdir, "tc_ruby_bench_cell.sqlite3") : "tc_ruby_bench_cell"
  cell = Cells.build(adapter: options[:adapter], name: "bench-#{SecureRandom.hex(2)}", cell_id: "bench-cell",
                     database: database, address: server.url, config: { in_transaction_deadline: 2.0 })
  cell.connection.create_table(:plain_users, force: true) do |t|
    t.string :username, null: false
    t.string :email
    t.timestamps
  end
  plain = Class.new(cell.base) { self.table_name = "plain_users" }
  inline_config = cell.config.dup_with(commit_in_background: false)
  inline = Class.new(cell.user) { claims_configuration inline_config }
  Object.const_set(:InlineCommitUser, inline) # a name for ActiveRecord
  apart_config = cell.config.dup_with(row_at_begin: false)
  apart = Class.new(cell.user) { claims_configuration apart_config }
  Object.const_set(:RowApartUser, apart)
  models = { "without claims" => plain, "with two claims" => cell.user, "commit inline" => inline,
             "row on its own" => apart }
  if variant_server
    variant_config = cell.config.dup_with(address: variant_server.url)
    models["variant"] = Class.new(cell.user) { claims_configuration variant_config }
    Object.const_set(:VariantServerUser, models["variant"])
  end
  if options[:without_commit]
    skipped_config = cell.config.dup_with
    SKIPPED_COMMITS << skipped_config
    models["no CommitUpdate"] = Class.new(cell.user) { claims_configuration skipped_config }
    Object.const_set(:NoCommitUser, models["no CommitUpdate"])
  end

  puts "#{options[:creates]} sequential creates x #{options[:rounds]} rounds per model; " \
       "cell: #{options[:adapter]}, server store: #{options[:store].sub(/\?.*/, '')}, " \
       "binary: #{ENV['TOPOLOGY_CLAIMS_BIN']}"
  variant_is = [*options[:variant_flags], options[:variant_store] && "store #{options[:variant_store]}"].compact.join(" ")
  puts "variant server: #{variant_is}" if variant_server
  # One warm-up round each (connections, prepared statements, the gRPC channel).
  models.each_value { |model| 20.times { |i| model.create!(username: "warm-#{SecureRandom.hex(6)}-#{i}") } }

  per_create = Hash.new { |h, k| h[k] = [] }
  parts = Hash.new { |h, k| h[k] = [] }
  server_pids = [server.pid, variant_server&.pid].compact
  processes = { "ruby" => ->(pid, _) { pid == Process.pid }, "servers" => ->(pid, _) { server_pids.include?(pid) },
                "postgresql" => ->(_, command) { command == "postgres" } }
  cpu = Hash.new { |h, k| h[k] = [] } # [label, process] => CPU per create of each round
  options[:rounds].times do |round|
    models.each do |label, model|
      Parts.reset
      before = options[:cpu] && processes.transform_values { |pick| cpu_seconds(pick) }
      threads_before = options[:cpu] && thread_cpu_seconds
      times = Array.new(options[:creates]) do
        name = "u#{SecureRandom.hex(8)}"
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        model.create!(username: name, email: "#{name}@example.com")
        Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      end
      TopologyClaims::Committer.instance.drain
      before&.each { |name, used| cpu[[label, name]] << (cpu_seconds(processes[name]) - used) / options[:creates] }
      if threads_before
        threads_after = thread_cpu_seconds
        THREAD_GROUPS.each do |group|
          cpu[[label, group]] << (threads_after[group] - threads_before[group]) / options[:creates]
        end
      end
      per_create[label] << median(times)
      Parts.spent.each { |part, total| parts[[part, label]] << total / options[:creates] }
      puts format("round %d %-16s median %s per create", round + 1, label, ms(median(times)))
    end
  end

  without = median(per_create["without claims"])
  with = median(per_create["with two claims"])
  inline_median = median(per_create["commit inline"])
  puts
  puts "median of the rounds' medians: without claims #{ms(without)}, with two claims #{ms(with)} " \
       "(#{format('%.2f', with / without)}x); with CommitUpdate inline (commit_in_background = false) " \
       "#{ms(inline_median)} (#{format('%.2f', inline_median / without)}x)"
  apart_median = median(per_create["row on its own"])
  puts "with the leases_outstanding row as a statement of its own (row_at_begin = false) " \
       "#{ms(apart_median)} (#{format('%.2f', apart_median / without)}x)"
  { "variant" => "the variant server (#{variant_is})",
    "no CommitUpdate" => "its CommitUpdate never sent (--without-commit)" }.each do |label, what|
    next unless per_create.key?(label)

    value = median(per_create[label])
    puts "with two claims, #{what}: #{ms(value)} (#{format('%.2f', value / without)}x), " \
         "BeginUpdate #{ms(median(parts[[:begin_update, label]]))}"
  end
  if options[:cpu]
    puts "CPU per create (mean of each round, median of the rounds; PostgreSQL: every postgres process on the machine):"
    models.each_key do |label|
      used = processes.keys.to_h { |name| [name, median(cpu[[label, name]])] }
      puts format("  %-16s %s", label,
                  (used.map { |name, value| "#{name} #{ms(value)}" } + ["in all #{ms(used.values.sum)}"]).join(", "))
      threads = THREAD_GROUPS.map { |group| "#{group} #{ms(median(cpu[[label, group]]))}" }
      puts format("  %-16s (ruby by thread: %s)", "", threads.join(", "))
    end
  end
  { "with two claims" => "CommitUpdate in the background", "commit inline" => "CommitUpdate inline" }.each do |label, how|
    total = median(per_create[label])
    puts "the save with two claims (#{how}), per create:"
    known = 0.0
    %i[begin_update local_row before_commit after_commit].each do |part|
      mean = median(parts[[part, label]].empty? ? [0.0] : parts[[part, label]])
      known += mean if %i[begin_update local_row].include?(part)
      puts format("  %-14s %s", part, ms(mean))
    end
    commit = median(parts[[:commit_update, label]].empty? ? [0.0] : parts[[:commit_update, label]])
    known += commit if label == "commit inline"
    puts format("  %-14s %s (the rest: the INSERTs, COMMIT, ActiveRecord's and the gem's Ruby)", "local work",
                ms([total - known, 0].max))
    where = label == "commit inline" ? "inside the save" : "after the save returned (the background thread)"
    puts format("  %-14s %s, %s", "commit_update", ms(commit), where)
  end
ensure
  server.stop
  variant_server&.stop
end
