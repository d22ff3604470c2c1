# frozen_string_literal: true

require "spec_helper"

RSpec.describe TopologyClaims::LocalTables do
  # The sidecars must find exactly the tables the Rust cell library makes.
  def rust_constant(path, name)
    text = File.read(File.expand_path("../../../#{path}", __dir__))
    body = text[/pub const #{name}: &str = "\\?\n?(.*?)";/m, 1] or raise "#{name} not found in #{path}"
    body.gsub("\\\n", "\n")
  end

  def normalized(sql) = sql.gsub(/\s+/, " ").gsub(/\s*;\s*\z/, "").strip

  it "creates the same SQLite tables as topology-claims-sqlite's LOCAL_LEASES_DDL" do
    expect(normalized(described_class::SQLITE_DDL))
      .to eq(normalized(rust_constant("backends/sqlite/src/local.rs", "LOCAL_LEASES_DDL")))
  end

  it "creates the same PostgreSQL tables as topology-claims-postgres's LOCAL_LEASES_DDL" do
    expect(normalized(described_class::POSTGRESQL_DDL))
      .to eq(normalized(rust_constant("backends/postgres/src/sql.rs", "LOCAL_LEASES_DDL")))
  end

  it "creates them idempotently" do
    cell = SpecSupport.cell(:postgresql, "a")
    2.times { TopologyClaims.create_local_tables!(cell.connection) }
    expect(cell.connection.table_exists?(:leases_outstanding)).to be(true)
    expect(cell.connection.table_exists?(:topology_claims_locks)).to be(true)
  end
end

RSpec.describe "local tables recreated from schema.rb" do
  # schema.rb dumps timestamptz as t.datetime, which db:schema:load recreates as `timestamp
  # without time zone`; SQLite's INTEGER microseconds survive as t.integer. In a database whose
  # TimeZone is UTC-12, the sidecars must still see a row's age, and a lock's expiry, as they
  # are (decision 113).
  def reload_from_schema_rb(connection)
    dump = StringIO.new
    ActiveRecord::SchemaDumper.dump(connection, dump)
    body = dump.string[/ActiveRecord::Schema\.define\(.*?\) do\n(.*)end\s*\z/m, 1]
    statements = body.scan(/^  create_table "(?:leases_outstanding|topology_claims_locks)".*?^  end\n/m)
                     .concat(body.scan(/^  add_index "leases_outstanding".*\n/))
    expect(statements.size).to be >= 2
    connection.drop_table(:leases_outstanding)
    connection.drop_table(:topology_claims_locks)
    migration = ActiveRecord::Migration.new
    migration.instance_variable_set(:@connection, connection)
    migration.verbose = false
    statements.each { |statement| migration.instance_eval(statement) }
  end

  def rows(cell) = cell.connection.select_value("SELECT count(*) FROM leases_outstanding").to_i

  %i[postgresql sqlite].each do |adapter|
    it "gives the sidecars the same ages and lock expiries on #{adapter} (a database at UTC-12)" do
      database = adapter == :sqlite ? File.join(SpecSupport::TMP, "cell-tz.sqlite3") : "tc_ruby_cell_tz"
      cell = Cells.build(adapter: adapter, name: "tz-#{adapter}", cell_id: "rb-tz-#{adapter}-#{SpecSupport.run_id}",
                         database: database, address: SpecSupport.server.url)
      if adapter == :postgresql
        cell.connection.execute("ALTER DATABASE tc_ruby_cell_tz SET TimeZone TO 'Etc/GMT+12'")
        cell.connection.reconnect!
      end
      reload_from_schema_rb(cell.connection)
      if adapter == :postgresql
        type = cell.connection.select_value("SELECT data_type FROM information_schema.columns " \
                                            "WHERE table_name = 'leases_outstanding' AND column_name = 'created_at'")
        expect(type).to eq("timestamp without time zone")
      end

      # A committed save whose row waits for the next transaction (the process stops first): the
      # reconciler commits it again and deletes the row once older than its staleness.
      name = unique("tz")
      cell.user.create!(username: name)
      expect(rows(cell)).to eq(1)
      sleep 1.2
      lock = "reconciler:#{cell.cell_id}"
      expired, held = if adapter == :postgresql
                        ["(now() AT TIME ZONE 'UTC') - interval '1 minute'", "(now() AT TIME ZONE 'UTC') + interval '1 minute'"]
                      else
                        now = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
                        [now - 60_000_000, now + 60_000_000]
                      end
      insert = lambda do |expires|
        cell.connection.execute("DELETE FROM topology_claims_locks")
        cell.connection.execute("INSERT INTO topology_claims_locks (name, holder, expires_at) " \
                                "VALUES (#{cell.connection.quote(lock)}, 'another-sidecar', #{expires})")
      end
      # Held by another sidecar for a minute more: this one stays out.
      insert.call(held)
      _out, err, status = SpecSupport.sidecar(cell, "reconcile", "--once", "--staleness", "1s")
      expect(status).to be_success, err
      expect(rows(cell)).to eq(1)
      # Expired a minute ago: taken, and the row is old enough.
      insert.call(expired)
      _out, err, status = SpecSupport.sidecar(cell, "reconcile", "--once", "--staleness", "1s")
      expect(status).to be_success, err
      expect(rows(cell)).to eq(0)
      expect(TopologyClaims::Testing.holder("usernames", name, config: cell.config)).to eq([cell.cell_id, :active])
    ensure
      TopologyClaims.clean_up!(cell.connection) if cell
    end
  end
end

RSpec.describe "loading the concern" do
  def load_with(version, env = {})
    script = <<~RUBY
      $LOAD_PATH.unshift #{File.expand_path('../lib', __dir__).inspect}
      require "active_record"
      ActiveRecord::VERSION.send(:remove_const, :MINOR)
      ActiveRecord::VERSION.const_set(:MINOR, #{version.split('.').last})
      ActiveRecord::VERSION.send(:remove_const, :MAJOR)
      ActiveRecord::VERSION.const_set(:MAJOR, #{version.split('.').first})
      ActiveRecord::VERSION.send(:remove_const, :STRING)
      ActiveRecord::VERSION.const_set(:STRING, "#{version}.0")
      require "topology_claims"
      TopologyClaims::Claimable
      puts "loaded"
    RUBY
    out, err, status = Open3.capture3(TopologyClaims::Testing.clean_env.merge(env), RbConfig.ruby, "-W0", "-e", script)
    [out + err, status]
  end

  it "loads on any ActiveRecord from 6.1 on, warns past the versions read, and refuses one before 6.1" do
    %w[6.1 7.0 7.1 7.2 8.0].each do |version|
      output, status = load_with(version)
      expect([version, output.strip, status.success?]).to eq([version, "loaded", true])
    end
    output, status = load_with("8.1")
    expect(status).to be_success
    expect(output).to match(/ActiveRecord 8\.1\.0 is newer than the versions .* checked against \(6\.1 to 8\.0\)/)
    output, status = load_with("6.0")
    expect(status).not_to be_success
    expect(output).to include("topology_claims needs ActiveRecord 6.1 or later, not 6.0.0")
  end
end
