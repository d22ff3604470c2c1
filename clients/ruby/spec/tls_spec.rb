# frozen_string_literal: true

require "spec_helper"

RSpec.describe "mutual TLS" do
  it "saves over mTLS with certificates from `topology-claims certs`" do
    dir = File.join(SpecSupport::TMP, "certs")
    cell_id = "rb-tls-#{SpecSupport.run_id}"
    [%w[ca], %w[server --name server], ["client", "--role", "cell", "--name", cell_id]].each do |args|
      _out, err, status = TopologyClaims::Testing.run("certs", *args, "--dir", dir)
      expect(status).to be_success, err
    end
    server = TopologyClaims::Testing::Server.start(
      "--tls-cert", "#{dir}/server.pem", "--tls-key", "#{dir}/server-key.pem", "--tls-client-ca", "#{dir}/ca.pem"
    )
    cell = Cells.build(adapter: :sqlite, name: "tls", cell_id: cell_id, database: File.join(SpecSupport::TMP, "tls.sqlite3"),
                       address: server.url("https"),
                       config: { tls: { ca: "#{dir}/ca.pem", cert: "#{dir}/cell-#{cell_id}.pem", key: "#{dir}/cell-#{cell_id}-key.pem" } })
    name = unique("secure")
    cell.user.create!(username: name)
    expect(lookup(cell, :username, name)).to eq([cell_id, "active"])

    plaintext = TopologyClaims::Client.new(cell.config.dup_with(address: server.url, tls: nil, max_attempts: 1))
    expect { plaintext.lookup_claim(:username, name) }.to raise_error(TopologyClaims::Unavailable)
  ensure
    server&.stop
  end
end
