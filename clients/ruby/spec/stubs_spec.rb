# frozen_string_literal: true

require "spec_helper"

RSpec.describe "the committed stubs" do
  it "are what bin/generate-stubs makes from proto/ today" do
    out = File.join(SpecSupport::TMP, "stubs")
    system(RbConfig.ruby, File.join(SpecSupport::ROOT, "bin/generate-stubs"), out, exception: true)
    %w[v1/claims_pb.rb v1/claims_services_pb.rb admin/v1/admin_pb.rb admin/v1/admin_services_pb.rb].each do |file|
      committed = File.read(File.join(SpecSupport::ROOT, "lib/topology/claims", file))
      fresh = File.read(File.join(out, "topology/claims", file))
      expect(fresh).to eq(committed), "lib/topology/claims/#{file} is stale: run clients/ruby/bin/generate-stubs"
    end
  end

  it "are in the serialized-descriptor form (google-protobuf 4.x no longer loads the DSL form)" do
    text = File.read(File.join(SpecSupport::ROOT, "lib/topology/claims/v1/claims_pb.rb"))
    expect(text).to include("add_serialized_file")
    expect(text).not_to include("generated_pool.build")
  end
end
