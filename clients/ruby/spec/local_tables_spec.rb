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

RSpec.describe "loading the concern" do
  def load_with(version, env = {})
    script = <<~RUBY
      $LOAD_PATH.unshift #{File.expand_path('../lib', __dir__).inspect}
      require "active_record"
      ActiveRecord::VERSION.send(:remove_const, :MINOR)
      ActiveRecord::VERSION.const_set(:MINOR, #{version.split('.').last})
      ActiveRecord::VERSION.send(:remove_const, :MAJOR)
      ActiveRecord::VERSION.const_set(:MAJOR, #{version.split('.').first})
      require "topology_claims"
      TopologyClaims::Claimable
      puts "loaded"
    RUBY
    out, err, status = Open3.capture3(TopologyClaims::Testing.clean_env.merge(env), RbConfig.ruby, "-W0", "-e", script)
    [out + err, status]
  end

  it "refuses an ActiveRecord version the gem was not tested with, unless told otherwise" do
    output, status = load_with("7.2")
    expect(status).not_to be_success
    expect(output).to match(/tested with ActiveRecord 6\.1.*TOPOLOGY_CLAIMS_ALLOW_UNTESTED_ACTIVERECORD/m)
    output, status = load_with("7.2", "TOPOLOGY_CLAIMS_ALLOW_UNTESTED_ACTIVERECORD" => "true")
    expect([output.strip, status.success?]).to eq(["loaded", true])
  end
end
