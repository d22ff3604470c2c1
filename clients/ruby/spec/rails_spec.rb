# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "support/rails_app"

RSpec.describe "a Rails application (Railtie, tasks, a scaffold controller)" do
  it "configures from config.x, credentials and the environment, installs, writes verify.toml, and answers 422 with every conflict" do
    root = File.join(SpecSupport::TMP, "rails-#{SecureRandom.hex(3)}")
    RailsApp.write(root, database: File.join(root, "db", "development.sqlite3"))
    cell_id = "rb-rails-#{SpecSupport.run_id}"
    RailsApp.write_credentials(root, "topology_claims:\n  cell_id: #{cell_id}\n  in_transaction_deadline: 2\n")
    taken = unique("railsy")
    TopologyClaims::Testing.claim_as("rb-rails-other", namespace: "usernames", value: taken,
                                     config: SpecSupport.cell(:sqlite, "a").config)
    TopologyClaims::Testing.claim_as("rb-rails-other", namespace: "emails", value: "#{taken}@example.com",
                                     config: SpecSupport.cell(:sqlite, "a").config)
    free = unique("free")
    log = File.join(root, "log.txt")
    env = TopologyClaims::Testing.clean_env.merge(
      "TOPOLOGY_CLAIMS_SERVER" => SpecSupport.server.url, "RAILS_ENV" => "development", "TC_RAILS_LOG" => log,
      "TC_TAKEN_USERNAME" => taken.upcase, "TC_TAKEN_EMAIL" => "#{taken}@example.com", "TC_FREE" => free
    )
    out, err, status = Open3.capture3(env, RbConfig.ruby, "-W0", File.expand_path("support/rails_script.rb", __dir__),
                                      root)
    expect(status).to be_success, "#{out}\n#{err}"
    results = JSON.parse(out.lines.last)

    # The environment wins over credentials, which win over config.x.
    expect(results["config"]).to eq("cell_id" => cell_id, "address" => SpecSupport.server.url, "timeout" => 3.0,
                                    "in_transaction_deadline" => 2)
    expect(results["install"]).to match(%r{create  config/initializers/topology_claims\.rb\ncreate  db/migrate/\d{14}_create_topology_claims_tables\.rb})
    expect(results["install_again"]).to include("exists  config/initializers/topology_claims.rb")
    expect(results["tables"]).to include("users", "leases_outstanding", "topology_claims_locks")
    expect(File.read(File.join(root, "db", "schema.rb"))).to include('create_table "leases_outstanding"')

    # verify_toml eager-loads the app: no model was loaded before it.
    expect(results["models_before_verify"]).to be_empty
    expect(results["verify_toml"]).to include("usernames").and include("emails").and include("users")

    # The scaffold controller: both conflicts on the form at once, 422, no exception.
    expect(results["create_taken"]).to eq([422, { "username" => ["has already been taken"],
                                                  "email" => ["has already been taken"] }])
    expect(results["create_free"][0]).to eq(201)
    expect(results["update_taken"]).to eq([422, { "email" => ["has already been taken"] }])
    expect(results["update_free"][0]).to eq(200)
    expect(results["users"]).to eq([[free, "#{free}@new.example.com"]])
    expect(TopologyClaims::Testing.holder("emails", "#{free}@new.example.com",
                                          config: SpecSupport.cell(:sqlite, "a").config)).to eq([cell_id, :active])

    # The log subscriber wrote the calls to Rails' log.
    # The call's own time, not the notification's (a real call over the network is never 0.0ms).
    expect(File.read(log)).to match(/TopologyClaims BeginUpdate OK \((?!0\.0ms)\d+\.\dms\)/)
      .and match(/TopologyClaims BeginUpdate ALREADY_EXISTS CLAIM_TAKEN/)
  end
end
